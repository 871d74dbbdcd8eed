package testenv

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

// Command returns the path of command, installing Debian package pkg
// first if it is missing (tools/ensure-package.sh: apt-get update and
// install, quick when the command is there). It fails the test, with the
// installer's output, if that is impossible: tests that need a tool do not
// silently skip.
func Command(t testing.TB, command, pkg string) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	script := filepath.Join(filepath.Dir(file), "..", "..", "tools", "ensure-package.sh")
	out, err := exec.Command("bash", script, command, pkg).Output()
	if err != nil {
		msg := err.Error()
		if ee, ok := err.(*exec.ExitError); ok {
			msg = string(ee.Stderr)
		}
		t.Fatalf("%s (Debian package %s) is needed and could not be installed: %s", command, pkg, msg)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return lines[len(lines)-1]
}

// SelfSigned writes a fresh self-signed ECDSA certificate for 127.0.0.1
// and localhost to dir: cert.pem, key.pem, and both in one file
// (combined.pem, the form HAProxy's `crt` takes). It returns the combined
// file and a TLS client configuration that trusts the certificate alone.
func SelfSigned(t testing.TB, dir string) (combined string, client *tls.Config) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: "parley test"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		DNSNames:     []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
	combined = filepath.Join(dir, "combined.pem")
	for name, b := range map[string][]byte{"cert.pem": certPEM, "key.pem": keyPEM, "combined.pem": append(append([]byte(nil), certPEM...), keyPEM...)} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return combined, &tls.Config{RootCAs: pool, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12}
}

// HAProxy runs haproxy (installed on demand) in the foreground with the
// configuration text cfg until the test ends, and waits until it accepts
// connections on every address in ready.
func HAProxy(t testing.TB, cfg string, ready ...string) {
	t.Helper()
	bin := Command(t, "haproxy", "haproxy")
	dir := t.TempDir()
	file := filepath.Join(dir, "haproxy.cfg")
	if err := os.WriteFile(file, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(bin, "-c", "-f", file).CombinedOutput(); err != nil {
		t.Fatalf("haproxy rejects its configuration: %v\n%s\n%s", err, out, cfg)
	}
	logPath := filepath.Join(dir, "haproxy.log")
	cmd := exec.Command(bin, "-db", "-f", file)
	done, err := launch(cmd, logPath)
	if err != nil {
		t.Fatalf("starting haproxy: %v", err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
	})
	err = waitReady("haproxy", cmd, done, logPath, func() error {
		for _, a := range ready {
			c, err := net.DialTimeout("tcp", a, time.Second)
			if err != nil {
				return err
			}
			c.Close()
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
