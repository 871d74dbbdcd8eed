package notify

import (
	"net"
	"net/http"
	"time"

	"github.com/parley-im/parley/config"
)

// HTTPClient is the client providers share: HTTP/2 where the server
// offers it (APNs requires it), enough idle connections for
// notify_concurrency requests per host, and timeouts so that a provider
// that does not answer holds only its own workers.
func HTTPClient(cfg config.Config) *http.Client {
	return &http.Client{Transport: &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          4 * cfg.NotifyConcurrency,
		MaxIdleConnsPerHost:   cfg.NotifyConcurrency,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   5 * time.Second,
		ResponseHeaderTimeout: cfg.NotifyTimeout,
	}}
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
		Shards: cfg.NotifyShards, Lease: cfg.NotifyLease, Timeout: cfg.NotifyTimeout, Concurrency: cfg.NotifyConcurrency,
		WriteFanoutMax: cfg.WriteFanoutMax, OnlineFanoutMax: cfg.OnlineFanoutMax, Prefix: cfg.RedisPrefix}
}
