package deploytest

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestLoadBalancerAndScrapeConfig checks deploy/nginx.conf and
// deploy/prometheus.yml against the replicas docker-compose.yml declares.
func TestLoadBalancerAndScrapeConfig(t *testing.T) {
	p := loadCompose(t)
	var replicaAddrs []string
	for _, name := range replicas {
		replicaAddrs = append(replicaAddrs, name+":"+listenPort(t, environment(t, service(t, p, name))["HTTP_ADDR"]))
	}
	nginx := regexp.MustCompile(`#.*`).ReplaceAllString(readConfig(t, "deploy/nginx.conf"), "")

	t.Run("nginx balances round robin over both replicas", func(t *testing.T) {
		upstream := regexp.MustCompile(`(?s)upstream orderservice \{(.*?)\n\s*\}`).FindStringSubmatch(nginx)
		if upstream == nil {
			t.Fatal("nginx.conf has no upstream orderservice block")
		}
		var servers []string
		for _, m := range regexp.MustCompile(`(?m)^\s*server\s+(\S+)`).FindAllStringSubmatch(upstream[1], -1) {
			servers = append(servers, strings.TrimSuffix(m[1], ";"))
		}
		if !slices.Equal(servers, replicaAddrs) {
			t.Errorf("upstream servers = %v, want %v", servers, replicaAddrs)
		}
		if m := regexp.MustCompile(`(?m)^\s*(ip_hash|hash|sticky|least_conn|random)\b`).FindString(upstream[1]); m != "" {
			t.Errorf("upstream uses %q: duplicates must be able to land on either replica", strings.TrimSpace(m))
		}
		if strings.Contains(upstream[1], "backup") {
			t.Errorf("a backup replica takes no traffic until the other fails")
		}
		if !regexp.MustCompile(`(?m)^\s*listen\s+8080;`).MatchString(nginx) {
			t.Errorf("nginx does not listen on 8080, the port lb publishes")
		}
	})

	t.Run("nginx says which replica answered", func(t *testing.T) {
		// The lab's instance lane reads it; a header set inside a location
		// would hide the server-level one there.
		if !regexp.MustCompile(`(?m)^\s*add_header\s+X-Upstream-Addr\s+\$upstream_addr\s+always;`).MatchString(nginx) {
			t.Errorf("nginx.conf does not add X-Upstream-Addr $upstream_addr always")
		}
		if n := len(regexp.MustCompile(`(?m)^\s*add_header\b`).FindAllString(nginx, -1)); n != 1 {
			t.Errorf("nginx.conf has %d add_header directives, want the one at server level", n)
		}
	})

	t.Run("nginx never retries a POST on the other replica", func(t *testing.T) {
		main := regexp.MustCompile(`(?s)location / \{(.*?)\n        \}`).FindStringSubmatch(nginx)
		if main == nil {
			t.Fatal("nginx.conf has no location / block")
		}
		if !regexp.MustCompile(`(?m)^\s*proxy_next_upstream off;`).MatchString(main[1]) {
			t.Errorf("location / must set proxy_next_upstream off")
		}
		if strings.Contains(nginx, "non_idempotent") {
			t.Errorf("nginx.conf allows retrying non-idempotent requests")
		}
		// Only GET and HEAD may be sent to the retrying location.
		m := regexp.MustCompile(`if \(\$request_method ~ \^\(([A-Z|]+)\)\$\) \{\s*return 418;`).FindStringSubmatch(main[1])
		if m == nil || m[1] != "GET|HEAD" {
			t.Errorf("location / must send exactly GET|HEAD to the retrying location (found %q)", m)
		}
	})

	t.Run("nginx passes the client's headers on unchanged", func(t *testing.T) {
		for _, h := range []string{"Idempotency-Key", "Authorization", "traceparent", "X-Request-Id"} {
			re := regexp.MustCompile(`(?im)(^|[;{])\s*(proxy_set_header|more_clear_input_headers)\s+"?` + regexp.QuoteMeta(h) + `\b`)
			if re.MatchString(nginx) {
				t.Errorf("nginx.conf rewrites or drops %s", h)
			}
		}
		if regexp.MustCompile(`(?m)(^|[;{])\s*(proxy_pass_request_headers off|underscores_in_headers)`).MatchString(nginx) {
			t.Errorf("nginx.conf stops forwarding request headers")
		}
	})

	t.Run("prometheus scrapes /metrics on both replicas", func(t *testing.T) {
		prom := readConfig(t, "deploy/prometheus.yml")
		var targets []string
		for _, m := range regexp.MustCompile(`(?m)^\s*-\s+(\S+:\d+)\s*$`).FindAllStringSubmatch(prom, -1) {
			targets = append(targets, m[1])
		}
		if !slices.Equal(targets, replicaAddrs) {
			t.Errorf("scrape targets = %v, want %v", targets, replicaAddrs)
		}
		if !strings.Contains(prom, "metrics_path: /metrics") {
			t.Errorf("prometheus.yml does not scrape /metrics")
		}
	})
}

func readConfig(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, path))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
