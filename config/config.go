// Package config holds parleyd's configuration: one Config struct whose
// fields document their defaults, loaded from a YAML file and overridden by
// PARLEY_<KEY> environment variables (PARLEY_LISTEN=127.0.0.1:7070).
//
// docs/config.md is the operator reference; a test checks that it lists
// every key of Config with its default.
package config

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"reflect"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// Config is everything an operator can set. The yaml tag is the key in the
// config file; the environment variable is PARLEY_ plus the key in upper case.
// The `default` tag is the value used when neither sets it.
type Config struct {
	// Listen is the gateway's TCP address (clients connect here).
	Listen string `yaml:"listen" default:"127.0.0.1:7070"`
	// AdminListen is the admin HTTP API's address.
	AdminListen string `yaml:"admin_listen" default:"127.0.0.1:8081"`
	// AdminToken is the bearer token of the admin API. Empty: parleyd
	// generates one at start-up and logs it.
	AdminToken string `yaml:"admin_token" default:""`
	// MetricsListen serves /metrics, /healthz, /readyz and pprof. Empty
	// disables it.
	MetricsListen string `yaml:"metrics_listen" default:"127.0.0.1:9090"`

	// PostgresURL is the authoritative store.
	PostgresURL string `yaml:"postgres_url" default:"postgres://parley:parley@127.0.0.1:5432/parley?sslmode=disable"`
	// PostgresMaxConns caps the pgx pool (snapshot statements have 4 more connections of their own).
	PostgresMaxConns int `yaml:"postgres_max_conns" default:"32"`
	// Migrate applies pending schema migrations at start-up.
	Migrate bool `yaml:"migrate" default:"true"`
	// RedisURL is the hot-state Redis (ignored when RedisCluster is set).
	RedisURL string `yaml:"redis_url" default:"redis://127.0.0.1:6379/0"`
	// RedisCluster is a comma-separated list of host:port seeds of a Redis
	// Cluster, used instead of RedisURL when set.
	RedisCluster string `yaml:"redis_cluster" default:""`
	// RedisPrefix is put in front of every Redis key, so several Parley
	// deployments (or test runs) can share one Redis. It must not contain
	// '{' or '}'.
	RedisPrefix string `yaml:"redis_prefix" default:"p:"`

	// GatewayID names this gateway in the routing table. Empty: hostname
	// plus listen port.
	GatewayID string `yaml:"gateway_id" default:""`
	// GatewayLease is how long a gateway's routing entries stay usable
	// after it stops renewing its lease (it renews every lease/3).
	GatewayLease time.Duration `yaml:"gateway_lease" default:"10s"`
	// Multicore runs one gnet event loop per CPU.
	Multicore bool `yaml:"multicore" default:"true"`

	// MaxFrame is the largest frame a client may send, in bytes.
	MaxFrame int `yaml:"max_frame" default:"65536"`
	// MaxBody is the largest message body, in bytes.
	MaxBody int `yaml:"max_body" default:"16384"`
	// MaxOutbound is how many bytes may wait for one slow device before it
	// gets a hint instead of pushes (at twice this it is disconnected).
	MaxOutbound int `yaml:"max_outbound" default:"1048576"`
	// AuthTimeout is how long a new connection has to send auth.
	AuthTimeout time.Duration `yaml:"auth_timeout" default:"10s"`
	// AuthRate is how many auth requests a second this gateway accepts,
	// checked before any database lookup; over it (and AuthBurst), auth is
	// answered RATE_LIMITED with a jittered retry_after_ms and the
	// connection is closed. 0 disables the limit. See docs/operations.md.
	AuthRate int `yaml:"auth_rate" default:"5000"`
	// AuthBurst is how many auth requests may arrive at once before
	// AuthRate applies.
	AuthBurst int `yaml:"auth_burst" default:"5000"`
	// AddrMaxConns is how many connections one client address may hold
	// open at this gateway; more are answered RATE_LIMITED and closed. 0
	// disables the limit. Addresses in AddrLimitExempt are not limited.
	AddrMaxConns int `yaml:"addr_max_conns" default:"1000"`
	// AddrAuthRate is how many auth requests a second one client address
	// may make at this gateway (checked before auth_rate, so one address
	// cannot use up auth_rate for everyone); over it and AddrAuthBurst,
	// auth is answered RATE_LIMITED and the connection closed. 0 disables it.
	AddrAuthRate int `yaml:"addr_auth_rate" default:"50"`
	// AddrAuthBurst is how many auth requests one address may make at once
	// before AddrAuthRate applies.
	AddrAuthBurst int `yaml:"addr_auth_burst" default:"200"`
	// AddrLimitExempt is a comma-separated list of CIDR prefixes whose
	// addresses the per-address limits do not apply to (by default the
	// loopback addresses: local tools and a local proxy that does not send
	// the PROXY protocol). Empty: every address is limited.
	AddrLimitExempt string `yaml:"addr_limit_exempt" default:"127.0.0.0/8,::1/128"`
	// IdleTimeout closes a connection that sent nothing for this long.
	IdleTimeout time.Duration `yaml:"idle_timeout" default:"90s"`

	// ProxyProtocol is "off" or "on". On: every gateway connection (TCP
	// and WebSocket) must come from an address in ProxyTrusted and begin
	// with a PROXY protocol v1 or v2 header, whose source address is the
	// client's address; anything else is closed before any frame.
	ProxyProtocol string `yaml:"proxy_protocol" default:"off"`
	// ProxyTrusted is a comma-separated list of CIDRs (or single
	// addresses) of the proxies allowed to connect when ProxyProtocol is on.
	ProxyTrusted string `yaml:"proxy_trusted" default:"127.0.0.1/32,::1/128"`
	// WSListen is the gateway's WebSocket address (GET /v1/ws, subprotocol
	// parley.msgpack), served by the same event loops as Listen. Empty: off.
	WSListen string `yaml:"ws_listen" default:""`
	// WSOrigins is a comma-separated list of the Origin values a WebSocket
	// handshake may carry (scheme://host[:port]); a handshake with another
	// Origin is refused with 403. Empty: any. A handshake without Origin
	// (not from a browser) is always accepted.
	WSOrigins string `yaml:"ws_origins" default:""`
	// RequestTimeout bounds the work of one request against the stores,
	// including the group commit it shares with other requests, and of
	// each batch of background work (fan-out, notification queueing).
	RequestTimeout time.Duration `yaml:"request_timeout" default:"10s"`

	// WriteFanoutMax: groups with fewer members use write fan-out ("push").
	WriteFanoutMax int `yaml:"write_fanout_max" default:"200"`
	// OnlineFanoutMax: groups up to this size use online-only fan-out
	// ("online"); larger ones use read fan-out ("pull").
	OnlineFanoutMax int `yaml:"online_fanout_max" default:"2000"`
	// PushCoalesce: pushes of online- and pull-tier conversations
	// (write_fanout_max members or more) wait up to this long in each
	// device's outbox, so that several go out in one write; 0 writes each
	// at once.
	PushCoalesce time.Duration `yaml:"push_coalesce" default:"0s"`
	// RelayCoalesce: typing and receipt frames wait up to this long in
	// each device's outbox, so that several go out in one write (a
	// device in many lively groups gets many); 0 writes each at once.
	RelayCoalesce time.Duration `yaml:"relay_coalesce" default:"100ms"`
	// SnapshotFullMax: a snapshot item with a gap up to this returns every
	// event after `after`.
	SnapshotFullMax int `yaml:"snapshot_full_max" default:"200"`
	// SnapshotTail: otherwise it returns only the newest this many.
	SnapshotTail int `yaml:"snapshot_tail" default:"50"`
	// RecallWindow is how long after sending a message its sender may
	// recall it.
	RecallWindow time.Duration `yaml:"recall_window" default:"120s"`
	// EditWindow is how long after sending a message its sender may edit
	// it.
	EditWindow time.Duration `yaml:"edit_window" default:"48h"`

	// HoleTimeout: a seq that was allocated but is still not committed this
	// long after a later seq committed is declared a hole (a tombstone row
	// is written) so syncing clients move past it. See docs/consistency.md.
	HoleTimeout time.Duration `yaml:"hole_timeout" default:"3s"`
	// CommitBatch is the most sends (or acks) one PostgreSQL transaction
	// commits together.
	CommitBatch int `yaml:"commit_batch" default:"256"`
	// CommitWorkers is how many group-commit transactions of sends may be
	// in flight (reads get half as many; acks have AckWorkers); full
	// batches under a backlog may use half as many again. Fewer workers
	// make bigger batches, hence less CPU and lower latency at moderate
	// load, but a lower peak (docs/operations.md, "Group commit settings").
	CommitWorkers int `yaml:"commit_workers" default:"4"`
	// RedeliveryDelay: a device that has not acked a pushed event this long
	// after the push gets a hint for that conversation (repeated with
	// exponential backoff); 0 disables the redelivery scan.
	RedeliveryDelay time.Duration `yaml:"redelivery_delay" default:"10s"`
	// CommitLinger: under load, a batch of sends that is not
	// full waits up to this long for more before it is committed: fewer,
	// bigger commits. A lone item after an idle spell is committed at
	// once. Reads never linger (they are few, and a user is waiting for
	// them).
	CommitLinger time.Duration `yaml:"commit_linger" default:"2ms"`
	// AckWorkers is how many transactions of acks may be in flight. Acks
	// are many (a device acks every AutoAck delay while it receives) and
	// nobody waits on them, so they are committed in few, big batches.
	AckWorkers int `yaml:"ack_workers" default:"1"`
	// AckLinger: under load, a batch of acks that is not full waits up to
	// this long for more (see CommitLinger).
	AckLinger time.Duration `yaml:"ack_linger" default:"10ms"`
	// AckCoalesce: an ack without rid (no reply on success) of a seq the
	// connection was given is held up to this long, and only the newest
	// per device and conversation is committed; 0 commits every ack as it
	// arrives. See docs/consistency.md.
	AckCoalesce time.Duration `yaml:"ack_coalesce" default:"1s"`
	// SendRate is the per-device sustained send rate (messages/s); 0
	// disables the limit.
	SendRate int `yaml:"send_rate" default:"100"`
	// SendBurst is the per-device send burst.
	SendBurst int `yaml:"send_burst" default:"200"`
	// MentionAllRate is how many sends with mention_all each conversation
	// may have per MentionAllPeriod (over it: RATE_LIMITED); 0: no limit.
	MentionAllRate int `yaml:"mention_all_rate" default:"5"`
	// MentionAllPeriod is the period of MentionAllRate.
	MentionAllPeriod time.Duration `yaml:"mention_all_period" default:"1m"`
	// FanoutWorkers is how many readers of the fan-out stream (per-member
	// conversation row writes) this process runs.
	FanoutWorkers int `yaml:"fanout_workers" default:"2"`
	// FanoutClaimIdle: a fan-out stream entry that a worker took but did
	// not finish for this long (the worker died) is claimed by another.
	FanoutClaimIdle time.Duration `yaml:"fanout_claim_idle" default:"10s"`

	// JWTHMACSecret enables JWT auth with HS256 tokens signed with this
	// secret (docs/auth.md).
	JWTHMACSecret string `yaml:"jwt_hmac_secret" default:""`
	// JWTJWKSURL enables JWT auth with RS256, ES256 and EdDSA tokens whose
	// keys (by kid) this JWKS document serves; an unknown kid fetches it
	// again, at most once per 30 s.
	JWTJWKSURL string `yaml:"jwt_jwks_url" default:""`
	// JWTPublicKeyFile enables JWT auth with tokens signed by the key of
	// this PEM public key file (RSA: RS256, ECDSA P-256: ES256, Ed25519:
	// EdDSA).
	JWTPublicKeyFile string `yaml:"jwt_public_key_file" default:""`
	// JWTIssuer, when set, must be every token's iss.
	JWTIssuer string `yaml:"jwt_issuer" default:""`
	// JWTAudience, when set, must be in every token's aud.
	JWTAudience string `yaml:"jwt_audience" default:""`
	// JWTDeviceClaim is the claim that holds the device id (sub holds the
	// user id).
	JWTDeviceClaim string `yaml:"jwt_device_claim" default:"did"`
	// JWTAutoProvision creates the user and device of a valid JWT that
	// names ones that do not exist (install_epoch 0); false: such a token
	// is refused with AUTH_FAILED.
	JWTAutoProvision bool `yaml:"jwt_auto_provision" default:"true"`

	// NotifyDelay: a registered device that has not acked a message this
	// long after its commit is notified (docs/notifications.md).
	NotifyDelay time.Duration `yaml:"notify_delay" default:"3s"`
	// NotifyPreview puts the first 100 characters of a message's body in
	// its notification (privacy: off by default).
	NotifyPreview bool `yaml:"notify_preview" default:"false"`
	// NotifyBadgeMax caps the badge (the user's total unread).
	NotifyBadgeMax int `yaml:"notify_badge_max" default:"999"`
	// NotifyTTL: a notification that a provider keeps refusing with 429 or
	// 5xx is retried this long after its message's commit, then dropped;
	// APNs and FCM keep it for an offline device until then too (at most
	// 4 weeks, FCM's limit).
	NotifyTTL time.Duration `yaml:"notify_ttl" default:"1h"`
	// NotifyShards is how many Redis hash tags the notification queue is
	// spread over (on a Redis Cluster, over that many slots). Each process
	// evaluates a shard's due messages together, so fewer shards make
	// bigger evaluations (less CPU per message when notifications are
	// light) and more shards evaluate more at once (more notifications a
	// second when they are many): docs/notifications.md, "Capacity".
	NotifyShards int `yaml:"notify_shards" default:"8"`
	// NotifyConcurrency is how many requests each provider may have in
	// flight from this process.
	NotifyConcurrency int `yaml:"notify_concurrency" default:"64"`
	// NotifyTimeout bounds one request to a provider.
	NotifyTimeout time.Duration `yaml:"notify_timeout" default:"10s"`
	// NotifyLease: a notification job that a worker took and did not
	// finish this long after (the worker or its process died) is taken by
	// another; it must exceed notify_timeout.
	NotifyLease time.Duration `yaml:"notify_lease" default:"30s"`
	// NotifyWebhookURL enables the webhook provider: notifications are
	// POSTed there, signed with NotifyWebhookSecret.
	NotifyWebhookURL string `yaml:"notify_webhook_url" default:""`
	// NotifyWebhookSecret is the webhook signature's HMAC key.
	NotifyWebhookSecret string `yaml:"notify_webhook_secret" default:""`
	// APNsEndpoint is Apple's push service (production).
	APNsEndpoint string `yaml:"apns_endpoint" default:"https://api.push.apple.com"`
	// APNsSandboxEndpoint serves registrations with sandbox: true.
	APNsSandboxEndpoint string `yaml:"apns_sandbox_endpoint" default:"https://api.sandbox.push.apple.com"`
	// APNsKeyFile is the .p8 token-signing key; set it (with the key id,
	// team id and topic) to enable APNs.
	APNsKeyFile string `yaml:"apns_key_file" default:""`
	// APNsKeyID is the signing key's id.
	APNsKeyID string `yaml:"apns_key_id" default:""`
	// APNsTeamID is the Apple developer team id.
	APNsTeamID string `yaml:"apns_team_id" default:""`
	// APNsTopic is the app's bundle id.
	APNsTopic string `yaml:"apns_topic" default:""`
	// FCMEndpoint is Firebase Cloud Messaging's HTTP v1 API.
	FCMEndpoint string `yaml:"fcm_endpoint" default:"https://fcm.googleapis.com"`
	// FCMCredentialsFile is a service account's JSON key; set it to
	// enable FCM.
	FCMCredentialsFile string `yaml:"fcm_credentials_file" default:""`

	// LogLevel is debug, info, warn or error.
	LogLevel string `yaml:"log_level" default:"info"`
}

// Default returns the configuration with every default applied.
func Default() Config {
	var c Config
	v := reflect.ValueOf(&c).Elem()
	for i := 0; i < v.NumField(); i++ {
		f := v.Type().Field(i)
		if err := setField(v.Field(i), f.Tag.Get("default")); err != nil {
			panic(fmt.Sprintf("config: bad default for %s: %v", f.Name, err))
		}
	}
	return c
}

// Load reads the defaults, then the YAML file at path (if path is not
// empty), then the PARLEY_* variables from environ (os.Environ() form).
func Load(path string, environ []string) (Config, error) {
	c := Default()
	if path != "" {
		b, err := os.ReadFile(path)
		if err != nil {
			return c, err
		}
		dec := yaml.NewDecoder(strings.NewReader(string(b)))
		dec.KnownFields(true)
		if err := dec.Decode(&c); err != nil && !errors.Is(err, io.EOF) {
			return c, fmt.Errorf("config %s: %w", path, err)
		}
	}
	env := map[string]string{}
	for _, kv := range environ {
		if k, val, ok := strings.Cut(kv, "="); ok && strings.HasPrefix(k, "PARLEY_") {
			env[k] = val
		}
	}
	v := reflect.ValueOf(&c).Elem()
	for i := 0; i < v.NumField(); i++ {
		key := v.Type().Field(i).Tag.Get("yaml")
		if val, ok := env["PARLEY_"+strings.ToUpper(key)]; ok {
			if err := setField(v.Field(i), val); err != nil {
				return c, fmt.Errorf("PARLEY_%s: %w", strings.ToUpper(key), err)
			}
		}
	}
	return c, c.Validate()
}

// Validate checks the values that would make parleyd misbehave.
func (c Config) Validate() error {
	var errs []error
	if c.MaxFrame < 64 {
		errs = append(errs, errors.New("max_frame must be at least 64"))
	}
	if c.MaxBody <= 0 || c.MaxBody > c.MaxFrame {
		errs = append(errs, errors.New("max_body must be positive and at most max_frame"))
	}
	if c.WriteFanoutMax < 0 || c.OnlineFanoutMax < c.WriteFanoutMax {
		errs = append(errs, errors.New("need 0 <= write_fanout_max <= online_fanout_max"))
	}
	if c.PushCoalesce < 0 || c.RelayCoalesce < 0 {
		errs = append(errs, errors.New("push_coalesce and relay_coalesce must not be negative"))
	}
	if strings.ContainsAny(c.RedisPrefix, "{}") {
		errs = append(errs, errors.New("redis_prefix must not contain { or }"))
	}
	if c.GatewayLease < time.Second {
		errs = append(errs, errors.New("gateway_lease must be at least 1s"))
	}
	if c.CommitBatch < 1 || c.CommitWorkers < 1 || c.AckWorkers < 1 {
		errs = append(errs, errors.New("commit_batch, commit_workers and ack_workers must be positive"))
	}
	if c.CommitLinger < 0 || c.AckLinger < 0 || c.AckCoalesce < 0 {
		errs = append(errs, errors.New("commit_linger, ack_linger and ack_coalesce must not be negative"))
	}
	if c.AuthRate < 0 || c.AuthBurst < 0 || (c.AuthRate > 0 && c.AuthBurst < 1) {
		errs = append(errs, errors.New("auth_rate must be at least 0, and auth_burst at least 1 when auth_rate is set"))
	}
	if c.AddrMaxConns < 0 || c.AddrAuthRate < 0 || c.AddrAuthBurst < 0 || (c.AddrAuthRate > 0 && c.AddrAuthBurst < 1) {
		errs = append(errs, errors.New("addr_max_conns and addr_auth_rate must be at least 0, and addr_auth_burst at least 1 when addr_auth_rate is set"))
	}
	if _, err := c.ExemptPrefixes(); err != nil {
		errs = append(errs, err)
	}
	if c.JWTDeviceClaim == "" {
		errs = append(errs, errors.New("jwt_device_claim must not be empty"))
	}
	if c.SnapshotTail < 1 || c.SnapshotFullMax < c.SnapshotTail {
		errs = append(errs, errors.New("need 1 <= snapshot_tail <= snapshot_full_max"))
	}
	if c.ProxyProtocol != "off" && c.ProxyProtocol != "on" {
		errs = append(errs, errors.New("proxy_protocol must be off or on"))
	}
	if _, err := c.ProxyTrustedPrefixes(); err != nil {
		errs = append(errs, err)
	}
	if c.WSListen != "" {
		if _, port, err := net.SplitHostPort(c.WSListen); err != nil || port == "0" || port == "" {
			errs = append(errs, errors.New("ws_listen must be host:port with a port other than 0"))
		} else if c.WSListen == c.Listen {
			errs = append(errs, errors.New("ws_listen must differ from listen"))
		}
	}
	if c.NotifyDelay < 0 || c.NotifyTTL <= 0 || c.NotifyBadgeMax < 0 || c.NotifyShards < 1 || c.NotifyConcurrency < 1 {
		errs = append(errs, errors.New("need notify_delay >= 0, notify_ttl > 0, notify_badge_max >= 0, notify_shards >= 1, notify_concurrency >= 1"))
	}
	if c.NotifyTTL > 28*24*time.Hour {
		errs = append(errs, errors.New("notify_ttl must be at most 672h (4 weeks): FCM refuses a longer ttl"))
	}
	if c.NotifyDelay <= c.AckCoalesce+c.AckLinger {
		errs = append(errs, errors.New("notify_delay must exceed ack_coalesce + ack_linger: an ack held that long is not seen in time, and its device would be notified"))
	}
	if c.NotifyTimeout <= 0 || c.NotifyLease <= c.NotifyTimeout {
		errs = append(errs, errors.New("need 0 < notify_timeout < notify_lease"))
	}
	return errors.Join(errs...)
}

// ProxyTrustedPrefixes parses ProxyTrusted: CIDRs, or single addresses
// (a /32 or /128).
func (c Config) ProxyTrustedPrefixes() ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, f := range strings.Split(c.ProxyTrusted, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		if !strings.Contains(f, "/") {
			a, err := netip.ParseAddr(f)
			if err != nil {
				return nil, fmt.Errorf("proxy_trusted: %w", err)
			}
			out = append(out, netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()))
			continue
		}
		p, err := netip.ParsePrefix(f)
		if err != nil {
			return nil, fmt.Errorf("proxy_trusted: %w", err)
		}
		if p.Addr().Is4In6() {
			p = netip.PrefixFrom(p.Addr().Unmap(), max(0, p.Bits()-96))
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

// WSOriginList returns WSOrigins split at commas (nil: any origin).
func (c Config) WSOriginList() []string {
	var out []string
	for _, f := range strings.Split(c.WSOrigins, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// ExemptPrefixes parses AddrLimitExempt.
func (c Config) ExemptPrefixes() ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, f := range strings.Split(c.AddrLimitExempt, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		p, err := netip.ParsePrefix(f)
		if err != nil {
			return nil, fmt.Errorf("addr_limit_exempt: %w", err)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

// Keys lists every key with its default, in declaration order (used by the
// docs check and `parleyd -print-config`).
func Keys() [][2]string {
	t := reflect.TypeOf(Config{})
	out := make([][2]string, 0, t.NumField())
	for i := 0; i < t.NumField(); i++ {
		out = append(out, [2]string{t.Field(i).Tag.Get("yaml"), t.Field(i).Tag.Get("default")})
	}
	return out
}

func setField(f reflect.Value, s string) error {
	switch f.Kind() {
	case reflect.String:
		f.SetString(s)
	case reflect.Bool:
		b, err := strconv.ParseBool(s)
		if err != nil {
			return err
		}
		f.SetBool(b)
	case reflect.Int, reflect.Int64:
		if f.Type() == reflect.TypeOf(time.Duration(0)) {
			d, err := time.ParseDuration(s)
			if err != nil {
				return err
			}
			f.SetInt(int64(d))
			return nil
		}
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return err
		}
		f.SetInt(n)
	default:
		return fmt.Errorf("unsupported kind %s", f.Kind())
	}
	return nil
}
