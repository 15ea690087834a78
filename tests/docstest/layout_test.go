package docstest

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

const module = "github.com/orderservice/orderservice"

// packages lists the module's packages under every build tag, as paths
// from the repository's root, each with what its non-test files import.
func packages(t *testing.T) map[string][]string {
	t.Helper()
	cmd := exec.Command("go", "list", "-tags", "faults,ha,cluster,bursts,generated",
		"-f", `{{.ImportPath}} {{join .Imports " "}}`, "./...")
	cmd.Dir = repoRoot
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	pkgs := map[string][]string{}
	for line := range strings.Lines(string(out)) {
		f := strings.Fields(line)
		dir := strings.TrimPrefix(strings.TrimPrefix(f[0], module), "/")
		pkgs[dir] = f[1:]
	}
	return pkgs
}

// TestEveryPackageIsOnTheLayoutPage: docs/layout.md names every package
// (itself or a folder above it), so a package added without a word on the
// page fails here.
func TestEveryPackageIsOnTheLayoutPage(t *testing.T) {
	page, err := os.ReadFile(filepath.Join(repoRoot, "docs", "layout.md"))
	if err != nil {
		t.Fatal(err)
	}
	var named []string
	for _, m := range regexp.MustCompile("`([a-z./]+)`").FindAllStringSubmatch(string(page), -1) {
		named = append(named, strings.TrimSuffix(m[1], "/"))
	}
	for dir := range packages(t) {
		found := false
		for _, n := range named {
			if dir == n || strings.HasPrefix(dir, n+"/") {
				found = true
				break
			}
		}
		if !found {
			t.Errorf("package %s is not on docs/layout.md: say which wing it belongs to and what it holds", dir)
		}
	}
}

// TestTheServiceImportsNeitherTheLabNorTheProvingGround: the three wings
// lean one way only. The lab and the proving ground use the service; the
// service's packages (cmd/, internal/, client/, examples/) import nothing
// of lab/ or tests/, so the service can be read, built and shipped alone.
func TestTheServiceImportsNeitherTheLabNorTheProvingGround(t *testing.T) {
	pkgs := packages(t)
	service := 0
	for dir, imports := range pkgs {
		if strings.HasPrefix(dir, "lab/") || strings.HasPrefix(dir, "tests/") || strings.HasPrefix(dir, "tools/") {
			continue
		}
		service++
		for _, imp := range imports {
			if strings.HasPrefix(imp, module+"/lab/") || strings.HasPrefix(imp, module+"/tests/") {
				t.Errorf("%s (the service) imports %s", dir, imp)
			}
		}
	}
	if service < 15 {
		t.Fatalf("only %d service packages listed: go list did not see the module", service)
	}
	for dir := range pkgs {
		if strings.HasPrefix(dir, "internal/") && strings.Contains(dir, "test") {
			t.Errorf("%s: a test kit under internal/; the proving ground is tests/", dir)
		}
	}
}
