package notify

import (
	"crypto/tls"
	"crypto/x509"
	"net"
	"net/http"
	"time"

	"github.com/parley-im/parley/config"
)

// HTTP/2 health checks of provider connections: a connection on which
// nothing arrived for h2PingAfter is sent a PING, and closed when no
// answer comes within h2PingTimeout (or a write blocks that long), so a
// connection that died silently (a NAT or load balancer dropped it) is
// replaced before requests wait on it for notify_timeout. On a busy
// connection answers keep arriving and no PING is sent.
const (
	h2PingAfter   = 15 * time.Second
	h2PingTimeout = 5 * time.Second
)

// HTTPClient is the client providers share: HTTP/2 where the server
// offers it (APNs requires it) with health checks, enough idle
// connections for notify_concurrency requests per host, and timeouts so
// that a provider that does not answer holds only its own workers. It
// trusts the system's roots (and SSL_CERT_FILE).
func HTTPClient(cfg config.Config) *http.Client {
	return httpClient(cfg, nil, h2PingAfter, h2PingTimeout)
}

// httpClient is HTTPClient trusting roots instead of the system's when
// roots is not nil (tests: the fake providers' certificates), with the
// given health-check timing.
func httpClient(cfg config.Config, roots *x509.CertPool, pingAfter, pingTimeout time.Duration) *http.Client {
	t := &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          4 * cfg.NotifyConcurrency,
		MaxIdleConnsPerHost:   cfg.NotifyConcurrency,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   5 * time.Second,
		ResponseHeaderTimeout: cfg.NotifyTimeout,
		HTTP2:                 &http.HTTP2Config{SendPingTimeout: pingAfter, PingTimeout: pingTimeout, WriteByteTimeout: pingTimeout},
	}
	if roots != nil {
		t.TLSClientConfig = &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
	}
	return &http.Client{Transport: t}
}

// Providers returns the providers cfg has credentials for: the webhook
// when notify_webhook_url is set, APNs when apns_key_file is, FCM when
// fcm_credentials_file is.
func Providers(cfg config.Config, client *http.Client) ([]Provider, error) {
	var ps []Provider
	if cfg.NotifyWebhookURL != "" {
		ps = append(ps, NewWebhook(cfg.NotifyWebhookURL, cfg.NotifyWebhookSecret, client))
	}
	if cfg.APNsKeyFile != "" {
		a, err := NewAPNs(APNsConfig{Endpoint: cfg.APNsEndpoint, SandboxEndpoint: cfg.APNsSandboxEndpoint, KeyFile: cfg.APNsKeyFile,
			KeyID: cfg.APNsKeyID, TeamID: cfg.APNsTeamID, Topic: cfg.APNsTopic, TTL: cfg.NotifyTTL}, client)
		if err != nil {
			return nil, err
		}
		ps = append(ps, a)
	}
	if cfg.FCMCredentialsFile != "" {
		f, err := NewFCM(FCMConfig{Endpoint: cfg.FCMEndpoint, CredentialsFile: cfg.FCMCredentialsFile, TTL: cfg.NotifyTTL}, client)
		if err != nil {
			return nil, err
		}
		ps = append(ps, f)
	}
	return ps, nil
}

// ConfigOf is the notifier's Config from parleyd's.
func ConfigOf(cfg config.Config) Config {
	return Config{Delay: cfg.NotifyDelay, TTL: cfg.NotifyTTL, BadgeMax: int64(cfg.NotifyBadgeMax), Preview: cfg.NotifyPreview,
		Shards: cfg.NotifyShards, Lease: cfg.NotifyLease, Timeout: cfg.NotifyTimeout, StoreTimeout: cfg.RequestTimeout, Concurrency: cfg.NotifyConcurrency,
		WriteFanoutMax: cfg.WriteFanoutMax, OnlineFanoutMax: cfg.OnlineFanoutMax, Prefix: cfg.RedisPrefix}
}
