package conn_test

// JWT auth, refresh and expiry (docs/protocol.md, "JWT auth"), and every
// bad token: each gets its error and a closed connection (or, for a
// refresh, an error on an open one), is counted, and leaves the server
// healthy.

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/parley-im/parley/client"
	"github.com/parley-im/parley/config"
	"github.com/parley-im/parley/test/parleytest"
	"github.com/parley-im/parley/wire"
)

const jwtSecret = "conn-test-secret-0123456789abcdef"

// signJWT returns an HS256 token for user and device expiring at exp,
// signed with key.
func signJWT(t testing.TB, key, user, device string, exp time.Time) string {
	t.Helper()
	c := jwt.MapClaims{"sub": user, "did": device, "exp": exp.Unix(), "iat": time.Now().Unix()}
	s, err := jwt.NewWithClaims(jwt.SigningMethodHS256, c).SignedString([]byte(key))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func startJWTEnv(t *testing.T, mod func(*config.Config)) *parleytest.Env {
	t.Helper()
	return startEnv(t, func(c *config.Config) {
		c.MaxFrame = 65536
		c.JWTHMACSecret = jwtSecret
		if mod != nil {
			mod(c)
		}
	})
}

// authJWT sends auth {jwt} on a raw connection.
func (r *rawConn) authJWT(token string) {
	r.t.Helper()
	r.send(wire.Request{T: wire.TAuth, Rid: "auth", JWT: token})
}

func TestJWTAuthProvisions(t *testing.T) {
	env := startJWTEnv(t, nil)
	user, dev := name("ju"), name("jd")
	exp := time.Now().Add(time.Hour)
	r := dialRaw(t, env)
	r.authJWT(signJWT(t, jwtSecret, user, dev, exp))
	m := r.expect(wire.TAuthOK)
	if m.User != user || m.Device != dev || m.InstallEpoch != 0 || m.ExpiresAt != exp.Unix()*1000 {
		t.Fatalf("auth_ok = %+v, want user %s device %s epoch 0 expires_at %d", m, user, dev, exp.Unix()*1000)
	}
	r.ping()
	// The user and device exist now, like any other: the admin API sees them,
	// conversations take the user, and the device's next JWT finds it.
	var u struct {
		ID        string
		Suspended bool
		Devices   []struct {
			ID           string
			Connected    bool
			InstallEpoch int64 `json:"install_epoch"`
		}
	}
	if st := env.Admin(t, "GET", "/v1/users/"+user, nil, &u); st != http.StatusOK || u.ID != user || u.Suspended || len(u.Devices) != 1 || u.Devices[0].ID != dev || !u.Devices[0].Connected {
		t.Fatalf("GET user: %d %+v", st, u)
	}
	other := newUser(t, env, "jo")
	conv := name("c-jwt")
	env.Group(t, conv, user, other.User)
	sent, err := func() (wire.Message, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		c, err := client.DialJWT(ctx, env.Addr, signJWT(t, jwtSecret, user, dev, exp), client.DialOptions{})
		if err != nil {
			return wire.Message{}, err
		}
		defer c.Close()
		if c.Auth.ExpiresAt != exp.Unix()*1000 {
			t.Errorf("second login: expires_at %d", c.Auth.ExpiresAt)
		}
		return c.Send(ctx, conv, "m1", []byte("hi"))
	}()
	if err != nil || sent.Seq != 2 {
		t.Fatalf("send by the JWT device: %+v %v", sent, err)
	}
	// The second login replaced the first connection.
	if k := r.expect(wire.TKick); k.Reason != wire.KickReplaced {
		t.Fatalf("first connection: %+v", k)
	}
	// Static device tokens keep working beside JWTs; their auth_ok has no expires_at.
	sr := dialRaw(t, env)
	if m := sr.auth(other); m.ExpiresAt != 0 {
		t.Fatalf("static auth_ok carries expires_at %d", m.ExpiresAt)
	}
	assertServerHealthy(t, env)
}

func TestJWTConcurrentFirstLogins(t *testing.T) {
	env := startJWTEnv(t, nil)
	exp := time.Now().Add(time.Hour)
	// 40 connections of one new device at once, and 10 new devices of each
	// of 10 new users, each device logging in from 3 connections at once.
	type login struct{ user, dev string }
	var logins []login
	same := login{name("cu"), name("cd")}
	for range 40 {
		logins = append(logins, same)
	}
	users := make([]string, 10)
	for i := range users {
		users[i] = name("cv")
		for d := range 10 {
			for range 3 {
				logins = append(logins, login{users[i], fmt.Sprintf("%s-d%d", users[i], d)})
			}
		}
	}
	var wg sync.WaitGroup
	errs := make(chan error, len(logins))
	var mu sync.Mutex
	authed := map[string]int{} // device -> logins answered auth_ok
	start := make(chan struct{})
	for _, l := range logins {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			var kicked sync.Map
			c, err := client.DialJWT(ctx, env.Addr, signJWT(t, jwtSecret, l.user, l.dev, exp), client.DialOptions{
				OnServerFrame: func(m wire.Message) {
					if m.T == wire.TKick {
						kicked.Store(m.Reason, true)
					}
				}})
			if err != nil {
				// Another connection of the same device, which
				// authenticated later, replaced this one before its
				// auth_ok went out: the one rule for concurrent logins.
				if _, ok := kicked.Load(wire.KickReplaced); !ok {
					errs <- fmt.Errorf("%s: %w", l.dev, err)
				}
				return
			}
			mu.Lock()
			authed[l.dev]++
			mu.Unlock()
			if c.Auth.User != l.user || c.Auth.Device != l.dev || c.Auth.InstallEpoch != 0 {
				errs <- fmt.Errorf("%s: auth_ok %+v", l.dev, c.Auth)
			}
			c.Close()
		}()
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	// Exactly one row each.
	check := func(user string, want int) {
		var u struct{ Devices []struct{ ID string } }
		if st := env.Admin(t, "GET", "/v1/users/"+user, nil, &u); st != http.StatusOK || len(u.Devices) != want {
			t.Errorf("user %s: %d, %d devices, want %d", user, st, len(u.Devices), want)
		}
	}
	check(same.user, 1)
	for _, u := range users {
		check(u, 10)
	}
	for _, l := range logins {
		if authed[l.dev] == 0 {
			t.Errorf("no login of %s succeeded", l.dev)
		}
	}
	if n := env.Srv.MetricSum("parley_gateway_auths_total"); n < float64(len(logins)) {
		t.Errorf("auths counted: %v, want %d", n, len(logins))
	}
}

// jwtRefused dials, sends auth {jwt: token} and expects code and a closed connection.
func jwtRefused(t *testing.T, env *parleytest.Env, token string, code wire.Code) {
	t.Helper()
	r := dialRaw(t, env)
	r.authJWT(token)
	r.expectError(code, "auth")
	r.expectClosed(3 * time.Second)
}

func TestJWTBadTokens(t *testing.T) {
	env := startJWTEnv(t, nil)
	exp := time.Now().Add(time.Hour)
	owner := newUser(t, env, "owner") // a device made by the admin API
	good := signJWT(t, jwtSecret, name("bu"), name("bd"), exp)
	parts := strings.Split(good, ".")
	none, err := jwt.NewWithClaims(jwt.SigningMethodNone, jwt.MapClaims{"sub": "x", "did": "y", "exp": exp.Unix()}).
		SignedString(jwt.UnsafeAllowNoneSignatureType)
	if err != nil {
		t.Fatal(err)
	}
	big := jwt.MapClaims{"sub": name("bu"), "did": name("bd"), "exp": exp.Unix(), "pad": strings.Repeat("p", 8<<10)}
	bigTok, _ := jwt.NewWithClaims(jwt.SigningMethodHS256, big).SignedString([]byte(jwtSecret))
	for _, tc := range []struct {
		name  string
		token string
		code  wire.Code
	}{
		{"malformed", "this is not a token", wire.AuthFailed},
		{"truncated", good[:len(good)/2], wire.AuthFailed},
		{"bad base64", parts[0] + ".%%%." + parts[2], wire.AuthFailed},
		{"over 8 KiB", bigTok, wire.AuthFailed},
		{"wrong signature", signJWT(t, "another-secret", name("bu"), name("bd"), exp), wire.AuthFailed},
		{"alg none", none, wire.AuthFailed},
		{"expired", signJWT(t, jwtSecret, name("bu"), name("bd"), time.Now().Add(-time.Hour)), wire.TokenExpired},
		{"a device of another user", signJWT(t, jwtSecret, name("thief"), owner.ID, exp), wire.AuthFailed},
	} {
		t.Run(tc.name, func(t *testing.T) { jwtRefused(t, env, tc.token, tc.code) })
	}
	// Nothing was created for the refused tokens; the owner's device is intact.
	var u struct{ Devices []struct{ ID string } }
	if st := env.Admin(t, "GET", "/v1/users/"+owner.User, nil, &u); st != http.StatusOK || len(u.Devices) != 1 {
		t.Fatalf("owner: %d %+v", st, u)
	}
	dialRaw(t, env).auth(owner)
	if n := env.Srv.MetricSum("parley_gateway_auths_total"); n < 8 {
		t.Errorf("refused auths counted: %v", n)
	}
	assertServerHealthy(t, env)
}

func TestJWTOffOrNoProvision(t *testing.T) {
	// No JWT key configured: a JWT is refused.
	plain := startEnv(t, nil)
	r := dialRaw(t, plain)
	r.authJWT(signJWT(t, jwtSecret, "u", "d", time.Now().Add(time.Hour)))
	r.expectError(wire.AuthFailed, "auth")
	r.expectClosed(3 * time.Second)
	// jwt_auto_provision false: only devices that exist.
	env := startJWTEnv(t, func(c *config.Config) { c.JWTAutoProvision = false })
	jwtRefused(t, env, signJWT(t, jwtSecret, name("nu"), name("nd"), time.Now().Add(time.Hour)), wire.AuthFailed)
	dev := newUser(t, env, "np")
	r = dialRaw(t, env)
	r.authJWT(signJWT(t, jwtSecret, dev.User, dev.ID, time.Now().Add(time.Hour)))
	r.expect(wire.TAuthOK)
}

func TestJWTRefreshAndExpiry(t *testing.T) {
	env := startJWTEnv(t, nil)
	user, dev := name("ru"), name("rd")
	// Whole seconds (exp is in seconds): the session ends 2 to 3 s from now.
	exp := time.Now().Add(3 * time.Second).Truncate(time.Second)
	r := dialRaw(t, env)
	r.authJWT(signJWT(t, jwtSecret, user, dev, exp))
	r.expect(wire.TAuthOK)

	// Refused refreshes leave the connection open.
	for _, tc := range []struct {
		name, token string
		code        wire.Code
	}{
		{"another device", signJWT(t, jwtSecret, user, name("rd"), exp.Add(time.Hour)), wire.AuthFailed},
		{"another user", signJWT(t, jwtSecret, name("ru"), dev, exp.Add(time.Hour)), wire.AuthFailed},
		{"expired", signJWT(t, jwtSecret, user, dev, time.Now().Add(-time.Hour)), wire.TokenExpired},
		{"wrong signature", signJWT(t, "nope", user, dev, exp.Add(time.Hour)), wire.AuthFailed},
		{"garbage", "x.y.z", wire.AuthFailed},
	} {
		r.send(wire.Request{T: wire.TRefresh, Rid: "rf", JWT: tc.token})
		r.expectError(tc.code, "rf")
		r.ping()
	}
	// A good refresh moves expires_at; the connection outlives the first exp.
	exp2 := exp.Add(3 * time.Second)
	r.send(wire.Request{T: wire.TRefresh, Rid: "rf2", JWT: signJWT(t, jwtSecret, user, dev, exp2)})
	if m := r.expect(wire.TRefreshOK); m.Rid != "rf2" || m.ExpiresAt != exp2.UnixMilli() {
		t.Fatalf("refresh_ok = %+v, want expires_at %d", m, exp2.UnixMilli())
	}
	time.Sleep(time.Until(exp) + 200*time.Millisecond)
	r.ping()
	// Without another refresh, it is kicked at exp2 (no leeway) and closed.
	k := r.expect(wire.TKick)
	if k.Reason != wire.KickExpired {
		t.Fatalf("kick = %+v", k)
	}
	// Never before exp; soon after it (the bound allows for a loaded machine).
	if late := time.Since(exp2); late < 0 || late > 1500*time.Millisecond {
		t.Errorf("kicked %v after exp", late)
	}
	r.expectClosed(3 * time.Second)

	// A connection of a static token cannot refresh.
	s, _ := authedRaw(t, env)
	s.send(wire.Request{T: wire.TRefresh, Rid: "rs", JWT: signJWT(t, jwtSecret, user, dev, exp2)})
	s.expectError(wire.AuthFailed, "rs")
	s.ping()
	if n := env.Srv.MetricSum("parley_gateway_kicks_total"); n != 1 {
		t.Errorf("kicks counted: %v, want 1", n)
	}
}

// TestClientRefreshes: the client library refreshes a JWT session before
// it expires, so the connection lives past the first token's exp.
func TestClientRefreshes(t *testing.T) {
	env := startJWTEnv(t, nil)
	user, dev := name("cr"), name("crd")
	var mu sync.Mutex
	issued := 0
	c := client.New(client.Options{Addr: env.Addr, RefreshBefore: time.Second, JWT: func(context.Context) (string, error) {
		mu.Lock()
		issued++
		mu.Unlock()
		return signJWT(t, jwtSecret, user, dev, time.Now().Add(3*time.Second)), nil
	}})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	first := c.Conn()
	time.Sleep(5 * time.Second)
	if c.Conn() != first || c.State() != client.Connected {
		t.Fatalf("the session did not survive its first token (state %v)", c.State())
	}
	mu.Lock()
	defer mu.Unlock()
	if issued < 2 {
		t.Fatalf("tokens fetched: %d, want a refresh", issued)
	}
}
