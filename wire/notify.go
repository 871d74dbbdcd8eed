package wire

// Notification requests (docs/protocol.md §8) and send's mentions (§10).

// Limits of the notification requests and of send.mentions.
const (
	// MaxNotifyToken is the longest notification token (bytes).
	MaxNotifyToken = 4096
	// MaxMentions is the most users one send may mention.
	MaxMentions = 50
)

// Notification providers (notify_register.provider).
const (
	ProviderAPNs    = "apns"
	ProviderFCM     = "fcm"
	ProviderWebhook = "webhook"
)

// Replies of the notification requests.
const (
	TNotifyRegisterOK   = "notify_register_ok"
	TNotifyUnregisterOK = "notify_unregister_ok"
	TConvSettingsOK     = "conv_settings_ok"
)

// NotifyRegisterOK answers notify_register.
type NotifyRegisterOK struct {
	T   string `msgpack:"t"`
	Rid string `msgpack:"rid"`
}

// NotifyUnregisterOK answers notify_unregister.
type NotifyUnregisterOK struct {
	T   string `msgpack:"t"`
	Rid string `msgpack:"rid"`
}

// ConvSettingsOK answers conv_settings.
type ConvSettingsOK struct {
	T          string `msgpack:"t"`
	Rid        string `msgpack:"rid"`
	Conv       string `msgpack:"conv"`
	MutedUntil int64  `msgpack:"muted_until"`
}
