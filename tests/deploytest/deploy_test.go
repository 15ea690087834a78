package deploytest

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/cli"
	"github.com/compose-spec/compose-go/v2/types"
)

// repoRoot is where the Dockerfile and docker-compose.yml live.
const repoRoot = "../.."

// The services docker-compose.yml declares.
const (
	svcPostgres   = "postgres"
	svcChannel    = "paymentchannel"
	svcReplica1   = "orderservice-1"
	svcReplica2   = "orderservice-2"
	svcLB         = "lb"
	svcPrometheus = "prometheus"
	svcLab        = "lab"
	svcNATS       = "nats"
	svcJaeger     = "jaeger"
	svcGrafana    = "grafana"
)

var replicas = []string{svcReplica1, svcReplica2}

// loadCompose loads docker-compose.yml the way `docker compose` does
// (schema validation, merge keys, normalisation), without the caller's
// environment, so nothing on this machine leaks into what is checked.
func loadCompose(t *testing.T) *types.Project { return loadComposeWith(t, nil) }

// loadComposeWith is loadCompose with env ("NAME=value") as the
// environment compose interpolates the file from, as a shell's would be.
func loadComposeWith(t *testing.T, env []string) *types.Project {
	t.Helper()
	root, err := filepath.Abs(repoRoot)
	if err != nil {
		t.Fatal(err)
	}
	opts, err := cli.NewProjectOptions([]string{filepath.Join(root, "docker-compose.yml")},
		cli.WithWorkingDirectory(root), cli.WithEnv(env))
	if err != nil {
		t.Fatalf("compose options: %v", err)
	}
	project, err := opts.LoadProject(context.Background())
	if err != nil {
		t.Fatalf("docker-compose.yml does not load: %v", err)
	}
	return project
}

// service returns the named service or fails the test.
func service(t *testing.T, p *types.Project, name string) types.ServiceConfig {
	t.Helper()
	s, err := p.GetService(name)
	if err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}
	return s
}

// environment flattens a service's environment. A variable without a value
// would be taken from the host running compose; none should be.
func environment(t *testing.T, s types.ServiceConfig) map[string]string {
	t.Helper()
	env := make(map[string]string, len(s.Environment))
	for k, v := range s.Environment {
		if v == nil {
			t.Fatalf("service %s: %s has no value and would come from the host", s.Name, k)
		}
		env[k] = *v
	}
	return env
}

// dockerfile is what the tests need to know about the Dockerfile.
type dockerfile struct {
	args   map[string]string // ARG defaults
	stages []stage
	builds []goBuild
}

// stage is one FROM and the instructions after it, continuation lines joined.
type stage struct {
	from         string
	instructions []instruction
}

type instruction struct {
	cmd  string // upper case: RUN, COPY, USER, ...
	rest string
}

// goBuild is one `go build` command of a RUN instruction.
type goBuild struct {
	flags []string // everything between `go build` and `-o`
	out   string   // the -o path
	pkg   string   // the ./cmd/X package, or a module's main package (natsServerModule)
}

var goBuildRE = regexp.MustCompile(`go build ((?:[^&;]*?\s)?)-o\s+(\S+)\s+(\./(?:lab/)?cmd/[\w./-]+|` + regexp.QuoteMeta(natsServerModule) + `)\b`)

// natsServerModule is the NATS server's main package, which the image
// builds at go.mod's version for compose's broker.
const natsServerModule = "github.com/nats-io/nats-server/v2"

func parseDockerfile(t *testing.T) dockerfile {
	t.Helper()
	f, err := os.Open(filepath.Join(repoRoot, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()

	var lines []string
	var cur strings.Builder
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(line, "#") || (line == "" && cur.Len() == 0) {
			continue
		}
		if strings.HasSuffix(line, `\`) {
			cur.WriteString(strings.TrimSuffix(line, `\`) + " ")
			continue
		}
		cur.WriteString(line)
		if s := strings.TrimSpace(cur.String()); s != "" {
			lines = append(lines, s)
		}
		cur.Reset()
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}

	d := dockerfile{args: map[string]string{}}
	for _, line := range lines {
		cmd, rest, _ := strings.Cut(line, " ")
		cmd = strings.ToUpper(cmd)
		rest = strings.TrimSpace(rest)
		switch {
		case cmd == "FROM":
			d.stages = append(d.stages, stage{from: rest})
		case len(d.stages) == 0 && cmd == "ARG":
			name, value, _ := strings.Cut(rest, "=")
			d.args[name] = value
		case len(d.stages) == 0:
			t.Fatalf("Dockerfile: %s before the first FROM", cmd)
		default:
			st := &d.stages[len(d.stages)-1]
			st.instructions = append(st.instructions, instruction{cmd: cmd, rest: rest})
		}
		if cmd == "RUN" {
			for _, m := range goBuildRE.FindAllStringSubmatch(rest, -1) {
				d.builds = append(d.builds, goBuild{flags: shellWords(t, m[1]), out: m[2], pkg: m[3]})
			}
		}
	}
	return d
}

// versionVar is the variable `orderservice version` prints, set at link time.
const versionVar = "github.com/orderservice/orderservice/internal/app.version"

// expand replaces each ${ARG} in flags as docker build would: with the
// build argument given, else the ARG's default.
func (d dockerfile) expand(flags []string, args map[string]string) []string {
	out := make([]string, len(flags))
	for i, f := range flags {
		out[i] = os.Expand(f, func(name string) string {
			if v, ok := args[name]; ok {
				return v
			}
			return d.args[name]
		})
	}
	return out
}

// buildArgs are the build arguments compose gives the image of s.
func buildArgs(t *testing.T, s types.ServiceConfig) map[string]string {
	t.Helper()
	out := map[string]string{}
	if s.Build == nil {
		return out
	}
	for k, v := range s.Build.Args {
		if v == nil {
			t.Fatalf("service %s: build argument %s has no value and would come from the host", s.Name, k)
		}
		out[k] = *v
	}
	return out
}

// final is the stage the image is made of.
func (d dockerfile) final() stage { return d.stages[len(d.stages)-1] }

// values of every instruction cmd in the stage.
func (s stage) values(cmd string) []string {
	var out []string
	for _, in := range s.instructions {
		if in.cmd == cmd {
			out = append(out, in.rest)
		}
	}
	return out
}

// imageBinaries are the paths the final stage copies binaries to, mapped to
// the ./cmd package each was built from.
func (d dockerfile) imageBinaries(t *testing.T) map[string]string {
	t.Helper()
	built := map[string]string{}
	for _, b := range d.builds {
		built[b.out] = b.pkg
	}
	out := map[string]string{}
	for _, c := range d.final().values("COPY") {
		words := strings.Fields(c)
		if len(words) < 3 || !strings.HasPrefix(words[0], "--from=") {
			continue
		}
		dest := words[len(words)-1]
		for _, src := range words[1 : len(words)-1] {
			pkg, ok := built[src]
			if strings.HasPrefix(src, "--") || !ok && !strings.HasPrefix(src, "/out/") {
				continue // a flag (--chown), or what is not a binary (a directory)
			}
			if !ok {
				t.Errorf("Dockerfile copies %s, which no `go build -o` produces", src)
				continue
			}
			out[filepath.Join(dest, filepath.Base(src))] = pkg
		}
	}
	return out
}

// shellWords splits s as a POSIX shell would, for the quoting a Dockerfile
// RUN line uses (single and double quotes, no expansions).
func shellWords(t *testing.T, s string) []string {
	t.Helper()
	var words []string
	var cur strings.Builder
	inWord := false
	var quote rune
	for _, r := range s {
		switch {
		case quote != 0 && r == quote:
			quote = 0
		case quote != 0:
			cur.WriteRune(r)
		case r == '\'' || r == '"':
			quote, inWord = r, true
		case r == ' ' || r == '\t':
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
		default:
			cur.WriteRune(r)
			inWord = true
		}
	}
	if quote != 0 {
		t.Fatalf("unbalanced %c in %q", quote, s)
	}
	if inWord {
		words = append(words, cur.String())
	}
	return words
}

// goLine is the go directive of go.mod.
func goLine(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "go "); ok {
			return strings.TrimSpace(v)
		}
	}
	t.Fatal("go.mod has no go line")
	return ""
}

func mustExist(t *testing.T, path string) os.FileInfo {
	t.Helper()
	fi, err := os.Stat(filepath.Join(repoRoot, path))
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return fi
}

func describe(v any) string { return fmt.Sprintf("%#v", v) }
