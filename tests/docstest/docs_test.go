package docstest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.yaml.in/yaml/v4"

	"github.com/orderservice/orderservice/internal/app"
	"github.com/orderservice/orderservice/tests/testdb"
	"github.com/orderservice/orderservice/tests/testproc"
)

// repoRoot is where the README is, and where a newcomer pastes from.
const repoRoot = "../.."

// dbURL is this package's own database, created fresh by TestMain.
var dbURL string

func TestMain(m *testing.M) {
	os.Exit(testdb.Main(func(url string) int { dbURL = url; return m.Run() }, "docs"))
}

// expect is what the output of each document's blocks must show: the
// answers its comments promise. A document with blocks to run must have an
// entry, so that a block that runs but no longer shows what it says fails.
var expect = map[string][]string{
	"README.md": {
		"HTTP/1.1 201 Created", "Idempotent-Replayed: true", "HTTP/1.1 422 Unprocessable Entity", "idempotency_key_reused",
		"HTTP/1.1 503 Service Unavailable", "HTTP/1.1 200 OK", `"charges":1`, `"duplicates_absorbed":1`,
		"HTTP/1.1 202 Accepted", `"status":"PAYMENT_PENDING"`, `"status":"PAID"`,
		"HTTP/1.1 409 Conflict", "invalid_transition", "A PAID order cannot be paid", "request_in_progress", "Retry-After: ",
		"Preference-Applied: wait=10",
	},
	"docs/api.md": {
		"HTTP/1.1 201 Created", "HTTP/1.1 200 OK", "Idempotent-Replayed: true", "HTTP/1.1 400 Bad Request",
		"idempotency_key_missing", `"status":"PAID"`, `"status":"DELIVERED"`, `"longest_window"`,
	},
	"docs/messaging.md":  {"Status: 201", "Idempotent-Replayed: true", `Permissions Violation for Publish to "orders.commands.acme.refund"`},
	"docs/lab.md":        {"\n5 orders for one intent\n"},
	"docs/operations.md": {"still failing after 5 deliveries", "1 dead-lettered commands replayed, 0 kept", `"status":"PAID"`},
}

// TestEveryDocsCommandPastes runs every sh and bash block of the README
// and docs/*.md, each in a fresh shell at the repository's root, against a
// service started as `make run` starts it (its defaults, the demo tenants'
// keys, the embedded channel and NATS). Only the addresses change: those
// `make run` listens on become the ports this test got, in the block's
// text, so a developer's own `make run` is left alone. A block runs with
// `set -eu` (and pipefail, in bash): a failing command, an undefined
// variable or a missing tool fails it. A block a test cannot run (it starts
// the service, or runs the tests) says why in a comment on the line before
// its fence: <!-- docs-test: skip: … -->.
func TestEveryDocsCommandPastes(t *testing.T) {
	m := startLikeMakeRun(t)
	naiveAddr := testproc.FreeAddr(t)
	rewrite := strings.NewReplacer(
		"localhost:8080", m.Addr, "127.0.0.1:8080", m.Addr,
		"localhost:8081", m.ChannelAddr, "127.0.0.1:8081", m.ChannelAddr,
		"localhost:4223", m.Embedded.Addr(), "127.0.0.1:4223", m.Embedded.Addr(),
		"localhost:8099", naiveAddr,
	)
	// What the blocks' own programs read: lab/naiveorders on its own
	// port, with its tables in this package's database; the service's own
	// commands (`go run ./cmd/orderservice dlq …`), the address of the
	// embedded NATS server they talk to, which `make run` has by default.
	env := append(os.Environ(), "NAIVE_ADDR="+naiveAddr, "NAIVE_DATABASE_URL="+dbURL, "NAIVE_CHANNEL_URL=http://"+m.ChannelAddr,
		"NATS_EMBEDDED_ADDR="+m.Embedded.Addr())
	// A newcomer pastes with `make run` going, which compiled the service:
	// its commands then only link. So does the test, before the blocks and
	// their timeouts.
	if out, err := exec.Command("go", "build", "-o", os.DevNull, "github.com/orderservice/orderservice/cmd/orderservice").CombinedOutput(); err != nil {
		t.Fatalf("build the service as make run does: %v\n%s", err, out)
	}

	files, err := filepath.Glob(filepath.Join(repoRoot, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	files = append([]string{filepath.Join(repoRoot, "README.md")}, files...)
	ran := map[string]bool{}
	outputs := map[string]string{}
	for _, path := range files {
		name := filepath.ToSlash(strings.TrimPrefix(path, repoRoot+string(filepath.Separator)))
		for _, b := range shellBlocks(t, path) {
			if b.skip != "" {
				// Not a skipped test: a block the document itself says no
				// test can run, and why.
				t.Logf("%s:%d not run: %s", name, b.line, b.skip)
				continue
			}
			t.Run(fmt.Sprintf("%s:%d", name, b.line), func(t *testing.T) {
				out := b.run(t, rewrite.Replace(b.text), env)
				t.Logf("output:\n%s", out)
				checkOutput(t, out)
				outputs[name] += out
			})
			ran[name] = true
		}
	}
	// What each document's blocks showed, together, against what it promises.
	for name := range ran {
		if _, ok := expect[name]; !ok {
			t.Errorf("%s has shell blocks to run: add what their output must show to expect", name)
		}
	}
	for name, wants := range expect {
		if !ran[name] {
			t.Errorf("expect names %s, which has no shell block the test ran", name)
			continue
		}
		for _, want := range wants {
			if !strings.Contains(outputs[name], want) {
				t.Errorf("%s: its blocks' output does not show %q, which it promises", name, want)
			}
		}
	}
}

// glued finds an HTTP status line that does not start its own line: an
// answer printed right after the previous body, which had no newline.
var glued = regexp.MustCompile(`[^\n]HTTP/[0-9.]+ [0-9]{3} `)

// shellErrors are what a shell says of a command it could not run, even
// where set -e does not stop it (a pipeline's first command in sh).
var shellErrors = regexp.MustCompile(`command not found|: not found|[Bb]ad substitution|unbound variable|parameter not set|No such file or directory`)

func checkOutput(t *testing.T, out string) {
	t.Helper()
	if m := glued.FindString(out); m != "" {
		t.Errorf("answers run together: %q starts an HTTP answer mid-line (end each curl's output with a newline)", m)
	}
	if m := shellErrors.FindString(out); m != "" {
		t.Errorf("the shell could not run a command: %q", m)
	}
}

// blockTimeout bounds one block's run.
const blockTimeout = 5 * time.Minute

// block is one fenced shell block of a document.
type block struct {
	line int    // of its opening fence
	lang string // sh or bash: the shell it is run with
	text string
	skip string // why it is not run, if it is not
}

var (
	fence      = regexp.MustCompile("^\\s*(```+|~~~+)\\s*([^\\s`]*)")
	skipMarker = regexp.MustCompile(`^<!--\s*docs-test:\s*skip:\s*(.+?)\s*-->$`)
	// Shell info strings other than sh and bash name no one shell to run
	// a block with.
	otherShells = []string{"shell", "console", "zsh", "shell-session"}
)

// shellBlocks reads the sh and bash blocks of a Markdown file.
func shellBlocks(t *testing.T, path string) []block {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []block
	var cur *block
	var open, prev string
	n := 0
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		n++
		line := sc.Text()
		if cur != nil || open != "" {
			if m := fence.FindStringSubmatch(line); m != nil && strings.HasPrefix(m[1], open) && m[2] == "" {
				if cur != nil {
					out = append(out, *cur)
				}
				cur, open = nil, ""
			} else if cur != nil {
				cur.text += line + "\n"
			}
			continue
		}
		if m := fence.FindStringSubmatch(line); m != nil {
			open = m[1]
			switch lang := strings.ToLower(m[2]); {
			case lang == "sh" || lang == "bash":
				cur = &block{line: n, lang: lang}
				if s := skipMarker.FindStringSubmatch(strings.TrimSpace(prev)); s != nil {
					cur.skip = s[1]
				}
			case slices.Contains(otherShells, lang):
				t.Errorf("%s:%d: a %q block: mark it sh or bash, the shell it needs (the test runs it with that one)", path, n, lang)
			}
			continue
		}
		if strings.TrimSpace(line) != "" {
			prev = line
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if cur != nil {
		t.Errorf("%s:%d: a block that never closes", path, cur.line)
	}
	return out
}

// run pastes the block into its shell, in a process group of its own so
// that whatever it left running in the background is stopped with it, and
// returns what it printed (stdout and stderr, interleaved as on a terminal).
func (b block) run(t *testing.T, script string, env []string) string {
	t.Helper()
	// Room for a block's `go build` on a fresh clone, under `make test`'s load.
	ctx, cancel := context.WithTimeout(context.Background(), blockTimeout)
	defer cancel()
	args := []string{"-eu", "-c", script}
	if b.lang == "bash" {
		args = []string{"-eu", "-o", "pipefail", "-c", script}
	}
	// One pipe for stdout and stderr, as a terminal is (`tee /dev/stderr`
	// reopens it; a file would be truncated). Its write end is handed over
	// as a file, so the wait for the shell does not wait for a server the
	// block left in the background, which holds it too: the process group's
	// end closes it.
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	read := make(chan []byte, 1)
	go func() { b, _ := io.ReadAll(r); read <- b }()
	cmd := exec.CommandContext(ctx, b.lang, args...)
	cmd.Dir = repoRoot
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = w, w
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	start := time.Now()
	err = cmd.Run()
	if cmd.Process != nil {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) // what it left behind
	}
	w.Close()
	var out string
	select {
	case b := <-read:
		out = string(b)
	case <-time.After(10 * time.Second):
		t.Fatalf("the block's output never ended: something it started outlived its process group")
	}
	r.Close()
	var exit *exec.ExitError
	switch {
	case ctx.Err() != nil:
		t.Fatalf("the block did not finish within %s:\n%s\noutput:\n%s", blockTimeout, script, out)
	case errors.As(err, &exit):
		t.Fatalf("the block fails (%v) under %s -eu, as pasted (with the test's addresses):\n%s\noutput:\n%s", err, b.lang, script, out)
	case err != nil:
		t.Fatal(err)
	}
	t.Logf("ran in %s", time.Since(start).Round(100*time.Millisecond))
	return out
}

// startLikeMakeRun starts the service as `make run` does, with its
// defaults, on ports of its own and this package's database.
func startLikeMakeRun(t *testing.T) *app.Main {
	t.Helper()
	cfg, err := app.LoadConfig(map[string]string{
		"DATABASE_URL":         dbURL,
		"HTTP_ADDR":            "127.0.0.1:0",
		"CHANNEL_ADDR":         "127.0.0.1:0",
		"CHANNEL_DATABASE_URL": testdb.Fresh(t, "docs_channel"),
		"NATS_EMBEDDED_ADDR":   "127.0.0.1:0",
		"NATS_STORE_DIR":       t.TempDir(),
		"LOG_LEVEL":            "warn",
	})
	if err != nil {
		t.Fatal(err)
	}
	logger := slog.New(slog.NewTextHandler(logWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	m, err := app.Start(context.Background(), cfg, logger)
	if err != nil {
		t.Fatalf("start the service: %v", err)
	}
	t.Cleanup(func() {
		if err := m.Close(); err != nil {
			t.Errorf("close the service: %v", err)
		}
	})
	return m
}

// logWriter hands the service's log lines to the test's log.
type logWriter struct{ t *testing.T }

func (w logWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// TestAPIDocMatchesTheContract holds docs/api.md's tables to
// api/openapi.yaml where a newcomer compares them with what the service
// answers: every test token of payment_method has its row, and the pay's
// row names every status a pay that went through can answer.
func TestAPIDocMatchesTheContract(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(repoRoot, "api", "openapi.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var spec struct {
		Paths      map[string]map[string]any `yaml:"paths"`
		Components struct {
			Schemas map[string]struct {
				Enum []string `yaml:"enum"`
			} `yaml:"schemas"`
		} `yaml:"components"`
	}
	if err := yaml.Unmarshal(raw, &spec); err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile(filepath.Join(repoRoot, "docs", "api.md"))
	if err != nil {
		t.Fatal(err)
	}
	tokens := spec.Components.Schemas["PaymentMethod"].Enum
	if len(tokens) == 0 {
		t.Fatal("api/openapi.yaml has no PaymentMethod enum")
	}
	for _, tok := range tokens {
		if !strings.Contains(string(doc), "| `"+tok+"` |") {
			t.Errorf("docs/api.md's table of test tokens has no row for %s, which api/openapi.yaml accepts", tok)
		}
	}
	var payRow string
	for line := range strings.Lines(string(doc)) {
		if strings.HasPrefix(line, "| `POST /v1/orders/{id}/pay` |") {
			payRow = line
		}
	}
	if payRow == "" {
		t.Fatal("docs/api.md has no row for POST /v1/orders/{id}/pay")
	}
	success := regexp.MustCompile(`^(2..|402)$`)
	post, _ := spec.Paths["/v1/orders/{id}/pay"]["post"].(map[string]any)
	responses, _ := post["responses"].(map[string]any)
	if len(responses) == 0 {
		t.Fatal("api/openapi.yaml has no responses for POST /v1/orders/{id}/pay")
	}
	for status := range responses {
		if success.MatchString(status) && !strings.Contains(payRow, status) {
			t.Errorf("docs/api.md's pay row does not name %s, which api/openapi.yaml says a pay answers:\n%s", status, payRow)
		}
	}
}
