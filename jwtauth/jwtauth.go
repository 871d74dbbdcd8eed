// Package jwtauth checks the JSON Web Tokens that apps hand their devices
// instead of a static device token (docs/auth.md): the signature against
// an HMAC secret, a PEM public key or a JWKS URL, then the claims (exp
// required; exp, nbf and iat with a leeway; iss and aud when configured;
// sub and the device claim present). It parses nothing by hand: tokens go
// through golang-jwt, JWKS documents through keyfunc.
package jwtauth

import (
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rsa"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/MicahParks/keyfunc/v3"
	"github.com/golang-jwt/jwt/v5"
	"golang.org/x/time/rate"
)

// MaxLen is the longest token accepted, in bytes; a longer one is refused
// before it is parsed.
const MaxLen = 8 << 10

// Leeway is the clock skew allowed on exp, nbf and iat when a token is
// checked. (A live session is still closed at exp itself.)
const Leeway = 30 * time.Second

// jwksFetchTimeout bounds one fetch of the JWKS document.
const jwksFetchTimeout = 5 * time.Second

// UnknownKIDRefetch is how often, at most, an unknown key id makes the
// JWKS document be fetched again.
const UnknownKIDRefetch = 30 * time.Second

// Errors of Verify. ErrExpired is the only one a client is told apart
// (TOKEN_EXPIRED); the others are all AUTH_FAILED.
var (
	ErrTooLong   = errors.New("jwt: token longer than 8 KiB")
	ErrExpired   = errors.New("jwt: token expired")
	ErrInvalid   = errors.New("jwt: invalid token")
	ErrNoKeys    = errors.New("jwt: JWT auth is not configured")
	ErrBadClaims = errors.New("jwt: missing or malformed sub or device claim")
)

// Config says where the keys come from and what the claims must say.
type Config struct {
	HMACSecret    string // HS256
	PublicKeyFile string // PEM: RSA (RS256), ECDSA P-256 (ES256) or Ed25519 (EdDSA)
	JWKSURL       string // RS256, ES256, EdDSA keys by kid
	Issuer        string // checked when set
	Audience      string // checked when set
	DeviceClaim   string // default "did"
	// Now is the clock (nil: time.Now).
	Now func() time.Time
}

// Enabled reports whether any key source is configured.
func (c Config) Enabled() bool {
	return c.HMACSecret != "" || c.PublicKeyFile != "" || c.JWKSURL != ""
}

// Claims are what a valid token says.
type Claims struct {
	User    string    // sub
	Device  string    // the device claim
	Expires time.Time // exp
}

// Verifier checks tokens. It is safe for concurrent use.
type Verifier struct {
	// Static after New.
	cfg     Config
	secret  []byte
	pub     any    // from PublicKeyFile
	pubAlg  string // the one algorithm pub verifies
	jwks    keyfunc.Keyfunc
	methods []string
	parser  *jwt.Parser
}

// New returns a verifier for cfg, or nil and no error when cfg configures
// no key source (JWT auth off). ctx bounds the JWKS refresh goroutine.
func New(ctx context.Context, cfg Config) (*Verifier, error) {
	if !cfg.Enabled() {
		return nil, nil
	}
	if cfg.DeviceClaim == "" {
		cfg.DeviceClaim = "did"
	}
	v := &Verifier{cfg: cfg}
	if cfg.HMACSecret != "" {
		v.secret = []byte(cfg.HMACSecret)
		v.methods = append(v.methods, jwt.SigningMethodHS256.Alg())
	}
	if cfg.PublicKeyFile != "" {
		pem, err := os.ReadFile(cfg.PublicKeyFile)
		if err != nil {
			return nil, fmt.Errorf("jwt_public_key_file: %w", err)
		}
		if v.pub, v.pubAlg, err = ParsePublicKey(pem); err != nil {
			return nil, fmt.Errorf("jwt_public_key_file %s: %w", cfg.PublicKeyFile, err)
		}
		v.methods = append(v.methods, v.pubAlg)
	}
	if cfg.JWKSURL != "" {
		k, err := keyfunc.NewDefaultOverrideCtx(ctx, []string{cfg.JWKSURL}, keyfunc.Override{
			HTTPTimeout: jwksFetchTimeout,
			// An unknown kid fetches the set again at most once per
			// UnknownKIDRefetch; in between it fails at once rather than
			// making the auth wait (the limiter refuses a wait longer
			// than RateLimitWaitMax outright; that bound also covers the
			// fetch itself).
			RefreshUnknownKID: rate.NewLimiter(rate.Every(UnknownKIDRefetch), 1),
			RateLimitWaitMax:  jwksFetchTimeout,
			RefreshErrorHandlerFunc: func(u string) func(context.Context, error) {
				return func(context.Context, error) {} // a failed fetch fails the auths that needed it
			},
		})
		if err != nil {
			return nil, fmt.Errorf("jwt_jwks_url: %w", err)
		}
		v.jwks = k
		for _, m := range []string{"RS256", "ES256", "EdDSA"} {
			if !contains(v.methods, m) {
				v.methods = append(v.methods, m)
			}
		}
	}
	opts := []jwt.ParserOption{
		jwt.WithValidMethods(v.methods),
		jwt.WithLeeway(Leeway),
		jwt.WithExpirationRequired(),
		jwt.WithIssuedAt(),
	}
	if cfg.Issuer != "" {
		opts = append(opts, jwt.WithIssuer(cfg.Issuer))
	}
	if cfg.Audience != "" {
		opts = append(opts, jwt.WithAudience(cfg.Audience))
	}
	if cfg.Now != nil {
		opts = append(opts, jwt.WithTimeFunc(cfg.Now))
	}
	v.parser = jwt.NewParser(opts...)
	return v, nil
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if x == y {
			return true
		}
	}
	return false
}

// Verify checks a token and returns its claims. Errors wrap ErrTooLong,
// ErrExpired, ErrInvalid or ErrBadClaims; a nil Verifier answers
// ErrNoKeys.
func (v *Verifier) Verify(ctx context.Context, token string) (Claims, error) {
	if v == nil {
		return Claims{}, ErrNoKeys
	}
	if len(token) > MaxLen {
		return Claims{}, ErrTooLong
	}
	claims := jwt.MapClaims{}
	_, err := v.parser.ParseWithClaims(token, claims, func(t *jwt.Token) (any, error) { return v.key(ctx, t) })
	if err != nil {
		// golang-jwt checks the claims only once the signature is good, so
		// an expired token here is a genuine one.
		if errors.Is(err, jwt.ErrTokenExpired) {
			return Claims{}, fmt.Errorf("%w: %v", ErrExpired, err)
		}
		return Claims{}, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	var c Claims
	var ok bool
	if c.User, ok = claims["sub"].(string); !ok || !validID(c.User) {
		return Claims{}, fmt.Errorf("%w: sub", ErrBadClaims)
	}
	if c.Device, ok = claims[v.cfg.DeviceClaim].(string); !ok || !validID(c.Device) {
		return Claims{}, fmt.Errorf("%w: %s", ErrBadClaims, v.cfg.DeviceClaim)
	}
	exp, err := claims.GetExpirationTime()
	if err != nil || exp == nil {
		return Claims{}, fmt.Errorf("%w: exp", ErrBadClaims)
	}
	c.Expires = exp.Time
	return c, nil
}

// validID is the shape of user and device ids the admin API accepts: 1
// to 128 bytes without { } | (they appear inside Redis key hash tags).
func validID(id string) bool {
	return id != "" && len(id) <= 128 && !strings.ContainsAny(id, "{}|\x00")
}

// key picks the verification key for t: the algorithm decides which source
// may answer, and each key verifies only its own algorithm (an HS256 token
// is never checked against a public key, nor an RS256 one against the
// secret).
func (v *Verifier) key(ctx context.Context, t *jwt.Token) (any, error) {
	alg := t.Method.Alg()
	switch {
	case alg == "HS256" && v.secret != nil:
		return v.secret, nil
	case alg == "HS256":
		return nil, errors.New("no HMAC secret configured")
	}
	if v.pub != nil && alg == v.pubAlg {
		if _, hasKID := t.Header["kid"]; !hasKID || v.jwks == nil {
			return v.pub, nil
		}
	}
	if v.jwks == nil {
		return nil, fmt.Errorf("no key for %s", alg)
	}
	k, err := v.jwks.KeyfuncCtx(ctx)(t)
	if err != nil {
		return nil, err
	}
	if k, ok := fitting(k, alg); ok {
		return k, nil
	}
	return nil, fmt.Errorf("no %s key in the key set for this token", alg)
}

// fitting returns k if it is a key of alg's type, or, for a set of keys
// (a token without kid), the set's keys of alg's type.
func fitting(k any, alg string) (any, bool) {
	switch k := k.(type) {
	case *rsa.PublicKey:
		return k, alg == "RS256"
	case *ecdsa.PublicKey:
		return k, alg == "ES256" && k.Curve.Params().Name == "P-256"
	case ed25519.PublicKey:
		return k, alg == "EdDSA"
	case jwt.VerificationKeySet:
		var out jwt.VerificationKeySet
		for _, x := range k.Keys {
			if _, ok := fitting(x, alg); ok {
				out.Keys = append(out.Keys, x)
			}
		}
		return out, len(out.Keys) > 0
	}
	return nil, false
}

// ParsePublicKey reads a PEM public key (or certificate's key) and says
// which algorithm it verifies: RS256, ES256 or EdDSA.
func ParsePublicKey(pem []byte) (any, string, error) {
	if k, err := jwt.ParseRSAPublicKeyFromPEM(pem); err == nil {
		return k, "RS256", nil
	}
	if k, err := jwt.ParseECPublicKeyFromPEM(pem); err == nil {
		if k.Curve.Params().Name != "P-256" {
			return nil, "", errors.New("an ECDSA key must be on P-256 (ES256)")
		}
		return k, "ES256", nil
	}
	if k, err := jwt.ParseEdPublicKeyFromPEM(pem); err == nil {
		return k, "EdDSA", nil
	}
	return nil, "", errors.New("not a PEM RSA, ECDSA P-256 or Ed25519 public key")
}
