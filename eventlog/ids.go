package eventlog

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strings"
)

// DirectID is the id of the direct conversation of users a and b: the
// same for the same pair, whichever of them asks.
func DirectID(a, b string) string {
	if b < a {
		a, b = b, a
	}
	h := sha256.Sum256([]byte(a + "\x00" + b))
	return "d." + hex.EncodeToString(h[:12])
}

// NewGroupID returns a random group conversation id.
func NewGroupID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return "g." + hex.EncodeToString(b[:])
}

// ValidGroupID refuses ids a caller may not choose for a group: empty,
// longer than 128 bytes, containing braces (Redis hash tags), or shaped
// like a direct conversation's.
func ValidGroupID(id string) error {
	switch {
	case id == "" || len(id) > 128:
		return errors.New("conv id must be 1 to 128 bytes")
	case strings.ContainsAny(id, "{}"):
		return errors.New("conv id must not contain { or }")
	case strings.HasPrefix(id, "d."):
		return errors.New("conv ids starting with d. are reserved for direct conversations")
	}
	return nil
}
