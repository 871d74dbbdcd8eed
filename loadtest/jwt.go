package loadtest

import (
	"crypto/ed25519"
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// jwtTTL is the life of the tokens the load tester signs.
const jwtTTL = time.Hour

// signer makes a JWT for a user's device.
type signer func(user, device string) (string, error)

// newSigner returns a signer with the HS256 secret or the PEM private
// key in keyFile (RSA: RS256, ECDSA P-256: ES256, Ed25519: EdDSA); nil
// when neither is given. The tokens carry sub, did and exp (an hour
// ahead), as a server with the default jwt_device_claim expects.
func newSigner(secret, keyFile string) (signer, error) {
	var method jwt.SigningMethod
	var key any
	switch {
	case secret != "" && keyFile != "":
		return nil, errors.New("give -jwt-secret or -jwt-key, not both")
	case secret != "":
		method, key = jwt.SigningMethodHS256, []byte(secret)
	case keyFile != "":
		pem, err := os.ReadFile(keyFile)
		if err != nil {
			return nil, fmt.Errorf("-jwt-key: %w", err)
		}
		if method, key, err = parsePrivateKey(pem); err != nil {
			return nil, fmt.Errorf("-jwt-key %s: %w", keyFile, err)
		}
	default:
		return nil, nil
	}
	return func(user, device string) (string, error) {
		now := time.Now()
		return jwt.NewWithClaims(method, jwt.MapClaims{"sub": user, "did": device, "iat": now.Unix(),
			"exp": now.Add(jwtTTL).Unix()}).SignedString(key)
	}, nil
}

func parsePrivateKey(pem []byte) (jwt.SigningMethod, any, error) {
	if k, err := jwt.ParseRSAPrivateKeyFromPEM(pem); err == nil {
		return jwt.SigningMethodRS256, k, nil
	}
	if k, err := jwt.ParseECPrivateKeyFromPEM(pem); err == nil {
		return jwt.SigningMethodES256, k, nil
	}
	if k, err := jwt.ParseEdPrivateKeyFromPEM(pem); err == nil {
		if ek, ok := k.(ed25519.PrivateKey); ok {
			return jwt.SigningMethodEdDSA, ek, nil
		}
	}
	return nil, nil, errors.New("not a PEM RSA, ECDSA P-256 or Ed25519 private key")
}

// jwtDevices names n users of the run and one device of each, with the
// given suffix; neither exists until a JWT login creates it.
func jwtDevices(prefix string, n int, suffix string) ([]string, []Device) {
	users, devs := make([]string, n), make([]Device, n)
	for i := range n {
		users[i] = prefix + "u" + strconv.Itoa(i)
		devs[i] = Device{ID: users[i] + suffix, User: users[i]}
	}
	return users, devs
}
