package app_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/orderservice/orderservice/internal/app"
	"github.com/orderservice/orderservice/tests/apptest"
	"github.com/orderservice/orderservice/tests/testdb"
	"github.com/orderservice/orderservice/tests/testproc"
)

// TestEveryStartFailureNamesItsSetting: whatever stops the start, the
// error names the setting to change, its value and what to check, in one
// line, and the process started nothing it leaves behind.
func TestEveryStartFailureNamesItsSetting(t *testing.T) {
	held := func(t *testing.T) string { // an address another process listens on
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		return ln.Addr().String()
	}
	nobody := func(t *testing.T, dbURL string) string { // the URL with a host where nothing listens
		u, _ := url.Parse(dbURL)
		u.Host = testproc.FreeAddr(t)
		return u.String()
	}
	aFile := func(t *testing.T) string { // a path that cannot be a directory
		p := filepath.Join(t.TempDir(), "file")
		if err := os.WriteFile(p, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		return filepath.Join(p, "store")
	}
	channelDB := testdb.Fresh(t, "channel")
	for _, c := range []struct {
		name    string
		env     func(t *testing.T) map[string]string
		setting string
		check   string
	}{
		{"the API's address is in use",
			func(t *testing.T) map[string]string { return map[string]string{"HTTP_ADDR": held(t)} },
			"HTTP_ADDR", "set HTTP_ADDR to a free address"},
		{"the embedded channel's address is in use",
			func(t *testing.T) map[string]string { return map[string]string{"CHANNEL_ADDR": held(t)} },
			"CHANNEL_ADDR", "or PAYMENT_CHANNEL_URL to a channel running elsewhere"},
		{"the embedded NATS server's address is in use",
			func(t *testing.T) map[string]string { return map[string]string{"NATS_EMBEDDED_ADDR": held(t)} },
			"NATS_EMBEDDED_ADDR", "or NATS_URL to a broker of your own"},
		{"the embedded NATS server cannot keep its store",
			func(t *testing.T) map[string]string { return map[string]string{"NATS_STORE_DIR": aFile(t)} },
			"NATS_STORE_DIR", "can be created and written"},
		{"no PostgreSQL answers within DB_START_TIMEOUT",
			func(t *testing.T) map[string]string {
				return map[string]string{"DATABASE_URL": nobody(t, dbURL), "DB_START_TIMEOUT": "1s"}
			},
			"DATABASE_URL", "check that PostgreSQL is running"},
		// With no CHANNEL_DATABASE_URL the channel's database is on
		// DATABASE_URL's server: the service's own is named, not the channel's.
		{"no PostgreSQL at all, the embedded channel's database on the same server",
			func(t *testing.T) map[string]string {
				return map[string]string{"DATABASE_URL": nobody(t, dbURL), "CHANNEL_DATABASE_URL": "", "DB_START_TIMEOUT": "1s"}
			},
			"DATABASE_URL", "within DB_START_TIMEOUT (1s)"},
		{"PostgreSQL refuses the user",
			func(t *testing.T) map[string]string {
				u, _ := url.Parse(dbURL)
				u.User = url.User("nobody_of_51")
				return map[string]string{"DATABASE_URL": u.String()}
			},
			"DATABASE_URL", "check the user, the password and the database"},
		{"the embedded channel's database answers nowhere",
			func(t *testing.T) map[string]string {
				return map[string]string{"CHANNEL_DATABASE_URL": nobody(t, testdb.Fresh(t, "channel")), "DB_START_TIMEOUT": "1s"}
			},
			"CHANNEL_DATABASE_URL", "or set CHANNEL_DATABASE_URL"},
		{"no broker at NATS_URL",
			func(t *testing.T) map[string]string {
				return map[string]string{"NATS_URL": "nats://" + testproc.FreeAddr(t)}
			},
			"NATS_URL", "or leave NATS_URL empty for the embedded server"},
	} {
		t.Run(c.name, func(t *testing.T) {
			env := c.env(t)
			if _, set := env["CHANNEL_DATABASE_URL"]; !set {
				env["CHANNEL_DATABASE_URL"] = channelDB // one for all: most never get that far
			}
			cfg := apptest.Config(t, dbURL, env)
			m, err := app.Start(context.Background(), cfg, slog.New(slog.DiscardHandler))
			if err == nil {
				m.Close()
				t.Fatal("the service started")
			}
			t.Log(err)
			var se *app.StartError
			switch {
			case !errors.As(err, &se):
				t.Errorf("the error names no setting: %v", err)
			case se.Setting != c.setting:
				t.Errorf("the error names %s, want %s: %v", se.Setting, c.setting, err)
			case !strings.HasPrefix(err.Error(), c.setting+"=") || !strings.Contains(err.Error(), c.check) ||
				strings.Contains(err.Error(), "\n"):
				t.Errorf("the error is not one line %s=… saying %q: %v", c.setting, c.check, err)
			}
			if strings.Contains(err.Error(), ":postgres@") {
				t.Errorf("the error shows a password: %v", err)
			}
		})
	}
	// And as a learner meets it: the binary says it on stderr, in one line,
	// and exits 1.
	t.Run("the binary prints it in one line and exits 1", func(t *testing.T) {
		bins, err := testproc.Build(t.TempDir(), orderservicePkg)
		if err != nil {
			t.Fatal(err)
		}
		addr := held(t)
		cmd := exec.Command(bins[orderservicePkg])
		cmd.Env = append(os.Environ(), "HTTP_ADDR="+addr, "DATABASE_URL="+dbURL)
		out, err := cmd.CombinedOutput()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != 1 {
			t.Fatalf("exit: %v\n%s", err, out)
		}
		want := "orderservice: HTTP_ADDR=" + addr + ": "
		if lines := strings.Split(strings.TrimSpace(string(out)), "\n"); !strings.HasPrefix(lines[len(lines)-1], want) {
			t.Errorf("the last line is not %q…:\n%s", want, out)
		}
	})
}

// TestTheLastStartLineSaysWhereTheAPIIs: a learner reads where to send the
// first request, localhost when the API listens on every interface.
func TestTheLastStartLineSaysWhereTheAPIIs(t *testing.T) {
	var logs bytes.Buffer
	var mu sync.Mutex
	cfg := apptest.Config(t, dbURL, map[string]string{"HTTP_ADDR": ":0", "LOG_LEVEL": "info"})
	m, err := app.Start(context.Background(), cfg, slog.New(slog.NewJSONHandler(lockedWriter{&mu, &logs}, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	_, port, _ := net.SplitHostPort(m.Addr)
	want := `"msg":"orderservice ready on http://localhost:` + port + `"`
	mu.Lock()
	defer mu.Unlock()
	if !strings.Contains(logs.String(), want) {
		t.Errorf("no %s in the start's log:\n%s", want, logs.String())
	}
}

// lockedWriter serialises writes from the service's goroutines.
type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
