package deploytest

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode"

	"github.com/compose-spec/compose-go/v2/types"
	"go.yaml.in/yaml/v4"
)

// The alert rules, their promtool unit tests, and where the rules' runbook
// lives. runbookURL is the operations guide on the module's repository.
const (
	alertsFile     = "deploy/prometheus/alerts.yml"
	alertTestsFile = "deploy/prometheus/alerts_test.yml"
	promConfigFile = "deploy/prometheus.yml"
	operationsFile = "docs/operations.md"
	runbookURL     = "https://github.com/orderservice/orderservice/blob/main/docs/operations.md#"
	alertsHeading  = "## Alerts"
	// promConfigInCompose is where compose mounts deploy/prometheus.yml
	// (the image's default --config.file, which the compose command names).
	promConfigInCompose = "/etc/prometheus/prometheus.yml"
)

// TestAlertRulesPassPromtool runs promtool on the rules, on the compose
// Prometheus's configuration (which loads them through rule_files, resolved
// against the configuration's directory), and on the rules' unit tests. It
// fails, never skips, without promtool.
func TestAlertRulesPassPromtool(t *testing.T) {
	promtool := lookPromtool(t)
	for _, args := range [][]string{
		{"check", "rules", alertsFile},
		{"check", "config", promConfigFile},
		{"test", "rules", alertTestsFile},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			out := runPromtool(t, promtool, args...)
			if args[1] == "config" && !strings.Contains(out, alertsFile) {
				t.Errorf("promtool check config %s did not check %s through rule_files:\n%s", promConfigFile, alertsFile, out)
			}
		})
	}
}

// lookPromtool finds promtool or fails the test saying how to install it.
func lookPromtool(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatalf("promtool is not installed (%v): the alert rules cannot be checked. "+
			"Install it with `apt-get install -y prometheus` (Debian's prometheus package ships promtool).", err)
	}
	return p
}

// runPromtool runs promtool in the repository root, where the paths in
// args are, and returns its output; it fails the test with that output when
// promtool does.
func runPromtool(t *testing.T, promtool string, args ...string) string {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), promtool, args...)
	cmd.Dir = repoRoot
	start := time.Now()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	t.Logf("promtool %s (%s): %s", strings.Join(args, " "), time.Since(start).Round(time.Millisecond), bytes.TrimSpace(out))
	return string(out)
}

// alertRule is one rule of alerts.yml, as far as these tests read it.
type alertRule struct {
	Alert       string            `yaml:"alert"`
	Expr        string            `yaml:"expr"`
	For         string            `yaml:"for"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

func loadAlertRules(t *testing.T) []alertRule {
	t.Helper()
	var file struct {
		Groups []struct {
			Name  string      `yaml:"name"`
			Rules []alertRule `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal([]byte(readConfig(t, alertsFile)), &file); err != nil {
		t.Fatalf("%s: %v", alertsFile, err)
	}
	if len(file.Groups) != 1 {
		t.Fatalf("%s has %d groups, want one", alertsFile, len(file.Groups))
	}
	rules := file.Groups[0].Rules
	if len(rules) == 0 {
		t.Fatalf("%s has no rules", alertsFile)
	}
	return rules
}

// TestAlertRulesAreComplete checks what promtool does not: every rule is an
// alert held for a while, has a severity, says what happened, and links
// its runbook, a heading of the Alerts section of docs/operations.md.
func TestAlertRulesAreComplete(t *testing.T) {
	rules := loadAlertRules(t)
	anchors := alertAnchors(t)
	seen := map[string]bool{}
	for _, r := range rules {
		if r.Alert == "" {
			t.Errorf("a rule is not an alert (expr %q): recording rules belong elsewhere", r.Expr)
			continue
		}
		if seen[r.Alert] {
			t.Errorf("%s: two rules have this name", r.Alert)
		}
		seen[r.Alert] = true
		if d, err := time.ParseDuration(r.For); err != nil || d <= 0 {
			t.Errorf("%s: for = %q, want a duration: one evaluation is not a condition", r.Alert, r.For)
		}
		if s := r.Labels["severity"]; s != "critical" && s != "warning" {
			t.Errorf("%s: severity = %q, want critical or warning", r.Alert, s)
		}
		for _, a := range []string{"summary", "description", "runbook_url"} {
			if strings.TrimSpace(r.Annotations[a]) == "" {
				t.Errorf("%s: no %s annotation", r.Alert, a)
			}
		}
		anchor, ok := strings.CutPrefix(r.Annotations["runbook_url"], runbookURL)
		if !ok {
			t.Errorf("%s: runbook_url %q is not a heading of %s (%s…)", r.Alert, r.Annotations["runbook_url"], operationsFile, runbookURL)
			continue
		}
		if !anchors[anchor] {
			t.Errorf("%s: runbook_url anchor #%s is no heading in the %q section of %s", r.Alert, anchor, alertsHeading, operationsFile)
		}
	}
}

// alertAnchors returns the GitHub anchors of the headings under the Alerts
// section of docs/operations.md.
func alertAnchors(t *testing.T) map[string]bool {
	t.Helper()
	f, err := os.Open(filepath.Join(repoRoot, operationsFile))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	anchors := map[string]bool{}
	in, fenced, found := false, false, false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			continue
		}
		if fenced || !strings.HasPrefix(line, "#") {
			continue
		}
		if strings.HasPrefix(line, "## ") || line == "##" {
			in = strings.TrimSpace(line) == alertsHeading
			found = found || in
			continue
		}
		if in && strings.HasPrefix(line, "###") {
			anchors[githubAnchor(strings.TrimLeft(line, "#"))] = true
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if !found {
		t.Fatalf("%s has no %q section", operationsFile, alertsHeading)
	}
	return anchors
}

// githubAnchor is the anchor GitHub gives a heading: lower case, spaces to
// hyphens, punctuation other than - and _ dropped.
func githubAnchor(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

func TestAlertRunbookAnchorsAreGitHubs(t *testing.T) {
	for heading, want := range map[string]string{
		" OrderserviceProcessingStuck":        "orderserviceprocessingstuck",
		" The broker's permissions":           "the-brokers-permissions",
		" `orderservice_dlq_depth` (a gauge)": "orderservice_dlq_depth-a-gauge",
	} {
		if got := githubAnchor(heading); got != want {
			t.Errorf("githubAnchor(%q) = %q, want %q", heading, got, want)
		}
	}
}

// TestAlertRulesAreEachUnitTested checks alerts_test.yml holds, for every
// rule, a test group in which it fires with its labels and annotations
// checked, and one whose series never make it fire.
func TestAlertRulesAreEachUnitTested(t *testing.T) {
	var file struct {
		RuleFiles []string `yaml:"rule_files"`
		Tests     []struct {
			AlertRuleTests []struct {
				EvalTime  string `yaml:"eval_time"`
				AlertName string `yaml:"alertname"`
				ExpAlerts []struct {
					ExpLabels      map[string]string `yaml:"exp_labels"`
					ExpAnnotations map[string]string `yaml:"exp_annotations"`
				} `yaml:"exp_alerts"`
			} `yaml:"alert_rule_test"`
		} `yaml:"tests"`
	}
	if err := yaml.Unmarshal([]byte(readConfig(t, alertTestsFile)), &file); err != nil {
		t.Fatalf("%s: %v", alertTestsFile, err)
	}
	if !slices.Equal(file.RuleFiles, []string{path.Base(alertsFile)}) {
		t.Errorf("%s tests rule files %v, want [%s]", alertTestsFile, file.RuleFiles, path.Base(alertsFile))
	}
	fires, quiet := map[string]bool{}, map[string]bool{}
	for _, group := range file.Tests {
		silent := map[string]bool{} // alerts this group expects at no time
		for _, at := range group.AlertRuleTests {
			if _, ok := silent[at.AlertName]; !ok {
				silent[at.AlertName] = true
			}
			for _, exp := range at.ExpAlerts {
				silent[at.AlertName] = false
				if exp.ExpLabels["severity"] == "" {
					t.Errorf("%s at %s: the test does not check the severity label", at.AlertName, at.EvalTime)
				}
				complete := true
				for _, a := range []string{"summary", "description", "runbook_url"} {
					if exp.ExpAnnotations[a] == "" {
						t.Errorf("%s at %s: the test does not check the %s annotation", at.AlertName, at.EvalTime, a)
						complete = false
					}
				}
				fires[at.AlertName] = fires[at.AlertName] || complete
			}
		}
		for name, s := range silent {
			quiet[name] = quiet[name] || s
		}
	}
	for _, r := range loadAlertRules(t) {
		if !fires[r.Alert] {
			t.Errorf("%s: no test in %s makes it fire and checks its labels and annotations", r.Alert, alertTestsFile)
		}
		if !quiet[r.Alert] {
			t.Errorf("%s: no test group in %s has series that must not make it fire", r.Alert, alertTestsFile)
		}
	}
}

// TestPrometheusInComposeLoadsTheAlertRules follows each rule_files entry
// of deploy/prometheus.yml both ways: from the file in the repository
// (where promtool check config resolves it) and from where compose mounts
// the configuration, through the prometheus service's bind mounts, to the
// same file.
func TestPrometheusInComposeLoadsTheAlertRules(t *testing.T) {
	var cfg struct {
		RuleFiles []string `yaml:"rule_files"`
	}
	if err := yaml.Unmarshal([]byte(readConfig(t, promConfigFile)), &cfg); err != nil {
		t.Fatalf("%s: %v", promConfigFile, err)
	}
	want := filepath.Join(absRoot(t), alertsFile)
	var inRepo []string
	for _, rf := range cfg.RuleFiles {
		if path.IsAbs(rf) || strings.ContainsAny(rf, "*?[") {
			t.Errorf("rule_files entry %q: want a path relative to the configuration, no glob (alerts_test.yml is not a rule file)", rf)
			continue
		}
		inRepo = append(inRepo, filepath.Join(absRoot(t), filepath.Dir(promConfigFile), filepath.FromSlash(rf)))
	}
	if !slices.Equal(inRepo, []string{want}) {
		t.Fatalf("%s rule_files resolve to %v in the repository, want [%s]", promConfigFile, inRepo, want)
	}

	vols := service(t, loadCompose(t), svcPrometheus).Volumes
	hostPath := func(container string) (string, bool) { return boundHostPath(vols, container) }
	if src, ok := hostPath(promConfigInCompose); !ok || src != filepath.Join(absRoot(t), promConfigFile) {
		t.Errorf("compose mounts %s at %s read-only? got %q (volumes %v)", promConfigFile, promConfigInCompose, src, vols)
	}
	for _, rf := range cfg.RuleFiles {
		container := path.Join(path.Dir(promConfigInCompose), rf)
		src, ok := hostPath(container)
		if !ok {
			t.Errorf("rule file %q is %s in the container, which no read-only bind mount of the prometheus service provides (volumes %v)", rf, container, vols)
			continue
		}
		if src != want {
			t.Errorf("rule file %q is %s in the container, mounted from %s, want %s", rf, container, src, want)
		}
	}
}

// boundHostPath is the file or folder of the host that a container sees at
// container through one of vols' read-only bind mounts.
func boundHostPath(vols []types.ServiceVolumeConfig, container string) (string, bool) {
	container = path.Clean(container)
	for _, v := range vols {
		if v.Type != types.VolumeTypeBind || !v.ReadOnly {
			continue
		}
		target := path.Clean(v.Target)
		if container == target {
			return v.Source, true
		}
		if rel, ok := strings.CutPrefix(container, target+"/"); ok {
			return filepath.Join(v.Source, filepath.FromSlash(rel)), true
		}
	}
	return "", false
}
