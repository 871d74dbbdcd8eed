package jwtauth

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/MicahParks/jwkset"
	"github.com/golang-jwt/jwt/v5"
)

const secret = "test-secret-0123456789abcdef0123"

func claims(exp time.Duration) jwt.MapClaims {
	now := time.Now()
	return jwt.MapClaims{"sub": "alice", "did": "alice-phone", "exp": now.Add(exp).Unix(), "iat": now.Unix()}
}

func sign(t testing.TB, m jwt.SigningMethod, key any, c jwt.MapClaims, kid string) string {
	t.Helper()
	tok := jwt.NewWithClaims(m, c)
	if kid != "" {
		tok.Header["kid"] = kid
	}
	s, err := tok.SignedString(key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func newVerifier(t testing.TB, cfg Config) *Verifier {
	t.Helper()
	v, err := New(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func pemFile(t *testing.T, pub any) (string, []byte) {
	t.Helper()
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	b := pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})
	p := filepath.Join(t.TempDir(), "key.pem")
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return p, b
}

func TestHS256(t *testing.T) {
	v := newVerifier(t, Config{HMACSecret: secret})
	c, err := v.Verify(t.Context(), sign(t, jwt.SigningMethodHS256, []byte(secret), claims(time.Hour), ""))
	if err != nil {
		t.Fatal(err)
	}
	if c.User != "alice" || c.Device != "alice-phone" || time.Until(c.Expires) < 59*time.Minute {
		t.Fatalf("claims %+v", c)
	}
	// Wrong secret, HS384/HS512 (not the key's algorithm), a tampered payload.
	for name, tok := range map[string]string{
		"wrong secret": sign(t, jwt.SigningMethodHS256, []byte("other"), claims(time.Hour), ""),
		"HS512":        sign(t, jwt.SigningMethodHS512, []byte(secret), claims(time.Hour), ""),
	} {
		if _, err := v.Verify(t.Context(), tok); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		}
	}
}

func TestClaimChecks(t *testing.T) {
	v := newVerifier(t, Config{HMACSecret: secret, Issuer: "https://id.example", Audience: "parley"})
	good := func() jwt.MapClaims {
		c := claims(time.Hour)
		c["iss"], c["aud"] = "https://id.example", "parley"
		return c
	}
	if _, err := v.Verify(t.Context(), sign(t, jwt.SigningMethodHS256, []byte(secret), good(), "")); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		edit func(jwt.MapClaims)
		want error
	}{
		{"expired", func(c jwt.MapClaims) { c["exp"] = time.Now().Add(-time.Minute).Unix() }, ErrExpired},
		{"no exp", func(c jwt.MapClaims) { delete(c, "exp") }, ErrInvalid},
		{"nbf in the future", func(c jwt.MapClaims) { c["nbf"] = time.Now().Add(time.Minute).Unix() }, ErrInvalid},
		{"iat in the future", func(c jwt.MapClaims) { c["iat"] = time.Now().Add(time.Minute).Unix() }, ErrInvalid},
		{"other issuer", func(c jwt.MapClaims) { c["iss"] = "https://evil.example" }, ErrInvalid},
		{"no issuer", func(c jwt.MapClaims) { delete(c, "iss") }, ErrInvalid},
		{"other audience", func(c jwt.MapClaims) { c["aud"] = "other" }, ErrInvalid},
		{"no sub", func(c jwt.MapClaims) { delete(c, "sub") }, ErrBadClaims},
		{"sub not a string", func(c jwt.MapClaims) { c["sub"] = 42 }, ErrBadClaims},
		{"no did", func(c jwt.MapClaims) { delete(c, "did") }, ErrBadClaims},
		{"did with a brace", func(c jwt.MapClaims) { c["did"] = "a{b}" }, ErrBadClaims},
		{"did too long", func(c jwt.MapClaims) { c["did"] = strings.Repeat("d", 129) }, ErrBadClaims},
	}
	for _, tc := range cases {
		c := good()
		tc.edit(c)
		if _, err := v.Verify(t.Context(), sign(t, jwt.SigningMethodHS256, []byte(secret), c, "")); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
	// Within the 30 s leeway: still good.
	for name, edit := range map[string]func(jwt.MapClaims){
		"expired 10 s ago": func(c jwt.MapClaims) { c["exp"] = time.Now().Add(-10 * time.Second).Unix() },
		"nbf in 10 s":      func(c jwt.MapClaims) { c["nbf"] = time.Now().Add(10 * time.Second).Unix() },
		"aud as a list":    func(c jwt.MapClaims) { c["aud"] = []string{"x", "parley"} },
	} {
		c := good()
		edit(c)
		if _, err := v.Verify(t.Context(), sign(t, jwt.SigningMethodHS256, []byte(secret), c, "")); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	// An expired token with a bad signature is a bad token, not an expired one.
	c := good()
	c["exp"] = time.Now().Add(-time.Hour).Unix()
	if _, err := v.Verify(t.Context(), sign(t, jwt.SigningMethodHS256, []byte("other"), c, "")); !errors.Is(err, ErrInvalid) {
		t.Errorf("expired and wrongly signed: %v, want ErrInvalid", err)
	}
}

func TestDeviceClaimName(t *testing.T) {
	v := newVerifier(t, Config{HMACSecret: secret, DeviceClaim: "device_id"})
	c := claims(time.Hour)
	c["device_id"] = "d-7"
	got, err := v.Verify(t.Context(), sign(t, jwt.SigningMethodHS256, []byte(secret), c, ""))
	if err != nil || got.Device != "d-7" {
		t.Fatalf("%+v %v", got, err)
	}
}

func TestRefused(t *testing.T) {
	rsaKey, _ := rsa.GenerateKey(rand.Reader, 2048)
	path, pemBytes := pemFile(t, &rsaKey.PublicKey)
	v := newVerifier(t, Config{HMACSecret: secret, PublicKeyFile: path})

	none, err := jwt.NewWithClaims(jwt.SigningMethodNone, claims(time.Hour)).SignedString(jwt.UnsafeAllowNoneSignatureType)
	if err != nil {
		t.Fatal(err)
	}
	// alg:none with an empty and with a made-up signature.
	hdr := base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"none","typ":"JWT"}`))
	payload := strings.Split(sign(t, jwt.SigningMethodHS256, []byte(secret), claims(time.Hour), ""), ".")[1]
	cases := map[string]string{
		"alg none":                  none,
		"alg none, forged sig":      hdr + "." + payload + ".c2ln",
		"HS256 signed with the PEM": sign(t, jwt.SigningMethodHS256, pemBytes, claims(time.Hour), ""),
		"garbage":                   "not.a.jwt",
		"two parts":                 "abc.def",
		"empty":                     "",
		"bad base64":                "!!!.???.***",
		"header not JSON":           base64.RawURLEncoding.EncodeToString([]byte("nope")) + "." + payload + ".x",
	}
	for name, tok := range cases {
		if _, err := v.Verify(t.Context(), tok); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		}
	}
	// The PEM key verifies RS256 only; without an HMAC secret, HS256 is refused outright.
	if _, err := v.Verify(t.Context(), sign(t, jwt.SigningMethodRS256, rsaKey, claims(time.Hour), "")); err != nil {
		t.Fatalf("RS256 from the PEM: %v", err)
	}
	if _, err := v.Verify(t.Context(), sign(t, jwt.SigningMethodPS256, rsaKey, claims(time.Hour), "")); !errors.Is(err, ErrInvalid) {
		t.Errorf("PS256: %v, want ErrInvalid", err)
	}
	pemOnly := newVerifier(t, Config{PublicKeyFile: path})
	if _, err := pemOnly.Verify(t.Context(), sign(t, jwt.SigningMethodHS256, pemBytes, claims(time.Hour), "")); !errors.Is(err, ErrInvalid) {
		t.Errorf("HS256 with the public key as secret: %v, want ErrInvalid", err)
	}
	// Over 8 KiB: refused before parsing, even if well signed.
	big := claims(time.Hour)
	big["pad"] = strings.Repeat("x", MaxLen)
	if _, err := v.Verify(t.Context(), sign(t, jwt.SigningMethodHS256, []byte(secret), big, "")); !errors.Is(err, ErrTooLong) {
		t.Errorf("9 KiB token: %v, want ErrTooLong", err)
	}
	var nilV *Verifier
	if _, err := nilV.Verify(t.Context(), none); !errors.Is(err, ErrNoKeys) {
		t.Errorf("no keys configured: %v", err)
	}
}

func TestPublicKeyFiles(t *testing.T) {
	ec, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	edPub, edPriv, _ := ed25519.GenerateKey(rand.Reader)
	rsaKey, _ := rsa.GenerateKey(rand.Reader, 2048)
	for _, tc := range []struct {
		name string
		pub  any
		m    jwt.SigningMethod
		priv crypto.Signer
	}{
		{"RS256", &rsaKey.PublicKey, jwt.SigningMethodRS256, rsaKey},
		{"ES256", &ec.PublicKey, jwt.SigningMethodES256, ec},
		{"EdDSA", edPub, jwt.SigningMethodEdDSA, edPriv},
	} {
		path, _ := pemFile(t, tc.pub)
		v := newVerifier(t, Config{PublicKeyFile: path})
		if _, err := v.Verify(t.Context(), sign(t, tc.m, tc.priv, claims(time.Hour), "")); err != nil {
			t.Errorf("%s: %v", tc.name, err)
		}
		// Another algorithm's token never verifies against this key.
		for _, other := range []struct {
			m    jwt.SigningMethod
			priv crypto.Signer
		}{{jwt.SigningMethodRS256, rsaKey}, {jwt.SigningMethodES256, ec}, {jwt.SigningMethodEdDSA, edPriv}} {
			if other.m == tc.m {
				continue
			}
			if _, err := v.Verify(t.Context(), sign(t, other.m, other.priv, claims(time.Hour), "")); !errors.Is(err, ErrInvalid) {
				t.Errorf("%s key, %s token: %v", tc.name, other.m.Alg(), err)
			}
		}
	}
	p384, _ := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	path, _ := pemFile(t, &p384.PublicKey)
	if _, err := New(t.Context(), Config{PublicKeyFile: path}); err == nil {
		t.Error("a P-384 key was accepted for ES256")
	}
}

// jwksServer serves a JWKS document of the keys in set and counts fetches.
type jwksServer struct {
	mu      sync.Mutex
	keys    map[string]any // kid -> public key
	fetches atomic.Int64
	srv     *httptest.Server
}

func newJWKS(t *testing.T) *jwksServer {
	j := &jwksServer{keys: map[string]any{}}
	j.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		j.fetches.Add(1)
		j.mu.Lock()
		st := jwkset.NewMemoryStorage()
		for kid, k := range j.keys {
			jwk, err := jwkset.NewJWKFromKey(k, jwkset.JWKOptions{Metadata: jwkset.JWKMetadataOptions{KID: kid}})
			if err != nil {
				panic(err)
			}
			_ = st.KeyWrite(r.Context(), jwk)
		}
		j.mu.Unlock()
		b, _ := st.JSONPublic(r.Context())
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(b)
	}))
	t.Cleanup(j.srv.Close)
	return j
}

func (j *jwksServer) add(kid string, k any) {
	j.mu.Lock()
	j.keys[kid] = k
	j.mu.Unlock()
}

func TestJWKS(t *testing.T) {
	j := newJWKS(t)
	ec, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	edPub, edPriv, _ := ed25519.GenerateKey(rand.Reader)
	rsaKey, _ := rsa.GenerateKey(rand.Reader, 2048)
	j.add("ec-1", &ec.PublicKey)
	j.add("ed-1", edPub)
	j.add("rsa-1", &rsaKey.PublicKey)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	v := newVerifier(t, Config{JWKSURL: j.srv.URL, HMACSecret: secret})
	_ = ctx
	for _, tc := range []struct {
		kid  string
		m    jwt.SigningMethod
		priv any
	}{{"ec-1", jwt.SigningMethodES256, ec}, {"ed-1", jwt.SigningMethodEdDSA, edPriv}, {"rsa-1", jwt.SigningMethodRS256, rsaKey}} {
		if _, err := v.Verify(t.Context(), sign(t, tc.m, tc.priv, claims(time.Hour), tc.kid)); err != nil {
			t.Errorf("%s: %v", tc.kid, err)
		}
	}
	// A kid naming a key of another type: refused.
	if _, err := v.Verify(t.Context(), sign(t, jwt.SigningMethodES256, ec, claims(time.Hour), "rsa-1")); !errors.Is(err, ErrInvalid) {
		t.Errorf("ES256 token naming an RSA kid: %v", err)
	}
	// HS256 naming a JWKS kid is checked against the secret only.
	if _, err := v.Verify(t.Context(), sign(t, jwt.SigningMethodHS256, []byte("x"), claims(time.Hour), "rsa-1")); !errors.Is(err, ErrInvalid) {
		t.Errorf("HS256 token naming an RSA kid: %v", err)
	}

	// A new key appears: its first token refetches the set; after that,
	// unknown kids refetch at most once per 30 s.
	before := j.fetches.Load()
	ec2, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	j.add("ec-2", &ec2.PublicKey)
	if _, err := v.Verify(t.Context(), sign(t, jwt.SigningMethodES256, ec2, claims(time.Hour), "ec-2")); err != nil {
		t.Fatalf("rotated-in key: %v", err)
	}
	if got := j.fetches.Load() - before; got != 1 {
		t.Errorf("fetches for a new kid: %d, want 1", got)
	}
	before = j.fetches.Load()
	for i := range 50 {
		tok := sign(t, jwt.SigningMethodES256, ec2, claims(time.Hour), "unknown-"+string(rune('a'+i%26)))
		if _, err := v.Verify(t.Context(), tok); !errors.Is(err, ErrInvalid) {
			t.Fatalf("unknown kid: %v", err)
		}
	}
	if got := j.fetches.Load() - before; got != 0 {
		t.Errorf("50 unknown kids within 30 s of a fetch made %d fetches, want 0", got)
	}
}

// FuzzVerify feeds arbitrary strings, and mutations of a valid token, to
// Verify: it must never panic and never accept a token it did not sign.
func FuzzVerify(f *testing.F) {
	good := sign(f, jwt.SigningMethodHS256, []byte(secret), claims(24*time.Hour), "")
	f.Add(good)
	f.Add("")
	f.Add("a.b.c")
	f.Add(good[:len(good)/2])
	f.Add(strings.Replace(good, ".", "..", 1))
	v := newVerifier(f, Config{HMACSecret: secret})
	f.Fuzz(func(t *testing.T, tok string) {
		c, err := v.Verify(context.Background(), tok)
		if err == nil && tok != good {
			// Only re-encodings of the same signed bytes may pass
			// (base64 padding variants are refused by the parser).
			if c.User != "alice" || c.Device != "alice-phone" {
				t.Fatalf("accepted a token it did not sign: %q -> %+v", tok, c)
			}
		}
	})
}
