package deploytest

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// imageCommands are the commands the image must contain: the service, the
// channel and the lab compose runs from the same image, and the healthcheck
// probe.
var imageCommands = []string{"./cmd/orderservice", "./cmd/paymentchannel", "./lab/cmd/lab", "./cmd/healthcheck"}

func TestDockerfile(t *testing.T) {
	d := parseDockerfile(t)
	if len(d.stages) < 2 {
		t.Fatalf("Dockerfile has %d stages, want a build stage and a runtime stage", len(d.stages))
	}

	t.Run("builds with the Go version of go.mod", func(t *testing.T) {
		from := d.stages[0].from
		for name, value := range d.args {
			from = strings.ReplaceAll(from, "${"+name+"}", value)
		}
		want := "golang:" + goLine(t) + "-"
		if !strings.HasPrefix(from, want) {
			t.Errorf("build stage FROM %s, want %s… (go.mod's go line; the golang image will not fetch a newer toolchain)", from, want)
		}
	})

	t.Run("downloads modules before copying the source", func(t *testing.T) {
		var order []string
		for _, in := range d.stages[0].instructions {
			switch {
			case in.cmd == "COPY" && strings.HasPrefix(in.rest, "go.mod go.sum"):
				order = append(order, "copy go.mod")
			case in.cmd == "RUN" && strings.Contains(in.rest, "go mod download"):
				order = append(order, "download")
			case in.cmd == "COPY" && strings.HasPrefix(in.rest, ". "):
				order = append(order, "copy source")
			}
		}
		if want := []string{"copy go.mod", "download", "copy source"}; !slices.Equal(order, want) {
			t.Errorf("build stage order = %v, want %v", order, want)
		}
	})

	t.Run("builds each command that exists, statically", func(t *testing.T) {
		var pkgs []string
		for _, b := range d.builds {
			pkgs = append(pkgs, b.pkg)
			if b.pkg != natsServerModule { // a module's, checked by TestComposeRunsTheNATSServerOfGoMod
				expectMainPackage(t, b.pkg)
			}
			if !slices.Contains(b.flags, "-trimpath") || !slices.ContainsFunc(b.flags, func(f string) bool { return strings.HasPrefix(f, "-ldflags=-s -w") }) {
				t.Errorf("go build of %s has flags %q, want -trimpath -ldflags='-s -w …'", b.pkg, b.flags)
			}
		}
		for _, want := range imageCommands {
			if !slices.Contains(pkgs, want) {
				t.Errorf("Dockerfile does not build %s (builds %v)", want, pkgs)
			}
		}
		if !slices.Contains(d.stages[0].values("ENV"), "CGO_ENABLED=0") {
			t.Errorf("build stage must set CGO_ENABLED=0: the runtime image has no libc")
		}
	})

	t.Run("the service is stamped with the VERSION build argument", func(t *testing.T) {
		// .git is not in the context: the version comes in as a build
		// argument, declared before the first FROM and again in the build stage.
		if _, ok := d.args["VERSION"]; !ok {
			t.Errorf("the Dockerfile declares no ARG VERSION before its first FROM (args %v)", d.args)
		}
		if !slices.Contains(d.stages[0].values("ARG"), "VERSION") {
			t.Errorf("the build stage does not take ARG VERSION in (ARGs %v): ${VERSION} would be empty there", d.stages[0].values("ARG"))
		}
		for _, b := range d.builds {
			if b.pkg == "./cmd/orderservice" && !slices.ContainsFunc(b.flags, func(f string) bool {
				return strings.HasPrefix(f, "-ldflags=") && strings.Contains(f, "-X "+versionVar+"=${VERSION}")
			}) {
				t.Errorf("go build of %s has flags %q, want -ldflags with -X %s=${VERSION}", b.pkg, b.flags, versionVar)
			}
		}
	})

	t.Run("the runtime image is distroless, nonroot, with every binary", func(t *testing.T) {
		final := d.final()
		if final.from != "gcr.io/distroless/static-debian12:nonroot" {
			t.Errorf("runtime stage FROM %s", final.from)
		}
		if users := final.values("USER"); len(users) == 0 || !strings.HasPrefix(users[len(users)-1], "nonroot") {
			t.Errorf("runtime USER = %v, want nonroot", users)
		}
		if ep := final.values("ENTRYPOINT"); !slices.Equal(ep, []string{`["/orderservice"]`}) {
			t.Errorf("ENTRYPOINT = %v, want [\"/orderservice\"]", ep)
		}
		if ex := strings.Fields(strings.Join(final.values("EXPOSE"), " ")); !slices.Contains(ex, "8080") || !slices.Contains(ex, "8081") {
			t.Errorf("EXPOSE = %v, want 8080 and 8081", ex)
		}
		bins := d.imageBinaries(t)
		for _, pkg := range imageCommands {
			want := "/" + filepath.Base(pkg)
			if bins[want] != pkg {
				t.Errorf("image has %s from %q, want it built from %s (image: %v)", want, bins[want], pkg, bins)
			}
		}
	})

	t.Run(".dockerignore keeps the build inputs and drops the rest", func(t *testing.T) {
		patterns := dockerignore(t)
		for _, want := range []string{".git", "node_modules", "tools/openapi-lint/node_modules", "docs/benchmarks/raw", "bin"} {
			if !ignored(patterns, want) {
				t.Errorf(".dockerignore does not exclude %s", want)
			}
		}
		// Everything `go build` reads: sources, the embedded migrations and
		// the lab's embedded page.
		err := filepath.WalkDir(repoRoot, func(path string, e fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(repoRoot, path)
			rel = filepath.ToSlash(rel)
			if e.IsDir() {
				if rel == ".git" || e.Name() == "node_modules" {
					return filepath.SkipDir
				}
				return nil
			}
			needed := rel == "go.mod" || rel == "go.sum" ||
				(strings.HasSuffix(rel, ".go") && !strings.HasSuffix(rel, "_test.go")) ||
				(strings.HasPrefix(rel, "migrations/") && strings.HasSuffix(rel, ".sql")) ||
				strings.HasPrefix(rel, "lab/cmd/lab/web/")
			if needed && ignored(patterns, rel) {
				t.Errorf(".dockerignore excludes %s, which the build needs", rel)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	})
}

func expectMainPackage(t *testing.T, pkg string) {
	t.Helper()
	dir := filepath.Join(repoRoot, pkg)
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil || len(files) == 0 {
		t.Errorf("Dockerfile builds %s, which has no Go files", pkg)
		return
	}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		file, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.PackageClauseOnly)
		if err != nil {
			t.Errorf("%s: %v", f, err)
			return
		}
		if file.Name.Name == "main" {
			return
		}
	}
	t.Errorf("Dockerfile builds %s, which is not a main package", pkg)
}

func dockerignore(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, ".dockerignore"))
	if err != nil {
		t.Fatal(err)
	}
	var patterns []string
	for line := range strings.Lines(string(b)) {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if strings.HasPrefix(line, "!") {
			t.Fatalf(".dockerignore exception %q: this test's matcher does not handle them", line)
		}
		patterns = append(patterns, strings.TrimPrefix(filepath.Clean(line), "/"))
	}
	return patterns
}

// ignored reports whether a .dockerignore pattern excludes path or one of
// its parent directories. It handles the forms used here: plain paths,
// globs, and a leading "**/".
func ignored(patterns []string, path string) bool {
	parts := strings.Split(path, "/")
	for _, p := range patterns {
		anyDepth := strings.HasPrefix(p, "**/")
		p = strings.TrimPrefix(p, "**/")
		depth := len(strings.Split(p, "/"))
		for start := 0; start+depth <= len(parts); start++ {
			if ok, _ := filepath.Match(p, strings.Join(parts[start:start+depth], "/")); ok {
				return true
			}
			if !anyDepth {
				break
			}
		}
	}
	return false
}
