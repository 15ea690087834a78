package deploytest

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestBuildsStampTheirVersion: `orderservice version` says which build it
// is. `go run` stamps no revision and the image's build has no .git, so
// make's builds stamp what git describes (devel without git), and the
// image's the VERSION build argument.
func TestBuildsStampTheirVersion(t *testing.T) {
	t.Run("make stamps what git describes", func(t *testing.T) {
		want := "devel"
		if out, err := exec.Command("git", "-C", repoRoot, "describe", "--always", "--dirty").Output(); err == nil {
			want = strings.TrimSpace(string(out))
		}
		if got := runMake(t, nil, "-s", "version"); got != want {
			t.Errorf("make version = %q, want git describe's %q", got, want)
		}
		if run := runMake(t, nil, "-n", "run"); !strings.Contains(run, "-X "+versionVar+"="+want) && want != "devel" {
			t.Errorf("make run does not stamp %s:\n%s", want, run)
		}
		bin := t.TempDir()
		runMake(t, nil, "-s", "build", "BIN="+bin)
		if got := runBinary(t, filepath.Join(bin, "orderservice"), "version"); got != "orderservice "+want {
			t.Errorf("make build's orderservice version = %q, want %q", got, "orderservice "+want)
		}
	})

	t.Run("without git, make stamps nothing and the binary says devel", func(t *testing.T) {
		noGit := []string{"GIT_DIR=" + filepath.Join(t.TempDir(), "no-git")}
		if got := runMake(t, noGit, "-s", "version"); got != "devel" {
			t.Errorf("make version without git = %q, want devel", got)
		}
		if run := runMake(t, noGit, "-n", "run"); strings.Contains(run, "-X ") {
			t.Errorf("make run without git stamps a version:\n%s", run)
		}
	})

	t.Run("the image's build stamps the VERSION build argument", func(t *testing.T) {
		d := parseDockerfile(t)
		i := slices.IndexFunc(d.builds, func(b goBuild) bool { return b.pkg == "./cmd/orderservice" })
		if i < 0 {
			t.Fatal("the Dockerfile does not build ./cmd/orderservice")
		}
		const version = "v1.2.3-deploytest"
		out := filepath.Join(t.TempDir(), "orderservice")
		args := append(append([]string{"build"}, d.expand(d.builds[i].flags, map[string]string{"VERSION": version})...), "-o", out, "./cmd/orderservice")
		cmd := exec.Command("go", args...)
		cmd.Dir = repoRoot
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, b)
		}
		if got := runBinary(t, out, "version"); got != "orderservice "+version {
			t.Errorf("the image's orderservice version = %q, want %q", got, "orderservice "+version)
		}
		if d.args["VERSION"] != "devel" {
			t.Errorf("ARG VERSION defaults to %q, want devel: an image built without it says so", d.args["VERSION"])
		}
	})
}

// runMake runs make at the repository root with env added, VERSION unset
// (the Makefile's own rule decides it), and returns its output.
func runMake(t *testing.T, env []string, args ...string) string {
	t.Helper()
	cmd := exec.Command("make", args...)
	cmd.Dir = repoRoot
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "VERSION=") && !strings.HasPrefix(kv, "MAKEFLAGS=") && !strings.HasPrefix(kv, "MAKELEVEL=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("make %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out))
}

func runBinary(t *testing.T, bin string, args ...string) string {
	t.Helper()
	out, err := exec.Command(bin, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", bin, strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out))
}
