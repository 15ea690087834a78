package deploytest

import (
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/compose-spec/compose-go/v2/types"
)

func TestCompose(t *testing.T) {
	p := loadCompose(t)

	t.Run("declares exactly its ten services", func(t *testing.T) {
		want := []string{svcLB, svcReplica1, svcReplica2, svcChannel, svcPostgres, svcPrometheus, svcLab, svcNATS, svcJaeger, svcGrafana}
		slices.Sort(want)
		if got := p.ServiceNames(); !slices.Equal(got, want) {
			t.Fatalf("services = %v, want %v", got, want)
		}
	})

	t.Run("every service has a healthcheck with timings", func(t *testing.T) {
		for name, s := range p.Services {
			hc := s.HealthCheck
			if hc == nil || hc.Disable || len(hc.Test) < 2 {
				t.Errorf("%s: no healthcheck (%v)", name, hc)
				continue
			}
			if hc.Test[0] != "CMD" && hc.Test[0] != "CMD-SHELL" {
				t.Errorf("%s: healthcheck test %q must start with CMD or CMD-SHELL", name, hc.Test)
			}
			if hc.Interval == nil || hc.Timeout == nil || hc.Retries == nil || hc.StartPeriod == nil {
				t.Errorf("%s: healthcheck needs interval, timeout, retries and start_period", name)
				continue
			}
			if time.Duration(*hc.Timeout) > time.Duration(*hc.Interval) || *hc.Retries == 0 {
				t.Errorf("%s: healthcheck timeout %s above interval %s, or no retries", name,
					time.Duration(*hc.Timeout), time.Duration(*hc.Interval))
			}
		}
	})

	t.Run("every service restarts unless stopped", func(t *testing.T) {
		for name, s := range p.Services {
			if s.Restart != types.RestartPolicyUnlessStopped {
				t.Errorf("%s: restart = %q, want %q", name, s.Restart, types.RestartPolicyUnlessStopped)
			}
		}
	})

	t.Run("replicas start after a healthy database, channel and broker", func(t *testing.T) {
		for _, name := range replicas {
			expectDependsOnHealthy(t, service(t, p, name), svcPostgres, svcChannel, svcNATS)
		}
	})

	t.Run("the channel starts after a healthy database", func(t *testing.T) {
		expectDependsOnHealthy(t, service(t, p, svcChannel), svcPostgres)
	})

	t.Run("the load balancer starts after both healthy replicas and publishes 8080", func(t *testing.T) {
		lb := service(t, p, svcLB)
		expectDependsOnHealthy(t, lb, replicas...)
		expectPublished(t, lb, 8080)
	})

	t.Run("the lab starts after the healthy load balancer, channel and database and publishes 8090", func(t *testing.T) {
		lab := service(t, p, svcLab)
		expectDependsOnHealthy(t, lab, svcLB, svcChannel, svcPostgres)
		expectPublished(t, lab, 8090)
	})

	t.Run("the pitfall lessons keep the naive service's tables in compose's PostgreSQL, apart from the service's", func(t *testing.T) {
		env := environment(t, service(t, p, svcLab))
		u, err := url.Parse(env["LAB_NAIVE_DATABASE_URL"])
		if err != nil || u.Host != svcPostgres+":5432" || u.Path == "/orderservice" || u.Path == "/paymentchannel" {
			t.Errorf("LAB_NAIVE_DATABASE_URL = %q, want a database of its own on %s:5432", env["LAB_NAIVE_DATABASE_URL"], svcPostgres)
		}
	})

	t.Run("the lab plays against the replicas behind lb, as a demo tenant", func(t *testing.T) {
		env := environment(t, service(t, p, svcLab))
		if u, err := url.Parse(env["LAB_SERVICE_URL"]); err != nil || u.Scheme != "http" || u.Host != svcLB+":8080" {
			t.Errorf("LAB_SERVICE_URL = %q, want http://%s:8080 (both replicas, round robin)", env["LAB_SERVICE_URL"], svcLB)
		}
		if u, err := url.Parse(env["LAB_CHANNEL_URL"]); err != nil || u.Scheme != "http" || u.Host != svcChannel+":8081" {
			t.Errorf("LAB_CHANNEL_URL = %q, want http://%s:8081", env["LAB_CHANNEL_URL"], svcChannel)
		}
		keys := environment(t, service(t, p, svcReplica1))["API_KEYS"]
		if key := env["LAB_API_KEY"]; key == "" || !strings.Contains(keys, "="+key) {
			t.Errorf("LAB_API_KEY = %q is not one of the replicas' API_KEYS %q", key, keys)
		}
		if got := listenPort(t, env["LAB_ADDR"]); got != "8090" {
			t.Errorf("the lab listens on %s, but publishes 8090", got)
		}
	})

	t.Run("the two replicas are the same service under two names", func(t *testing.T) {
		a, b := service(t, p, svcReplica1), service(t, p, svcReplica2)
		b.Name = a.Name
		if !reflect.DeepEqual(a, b) {
			t.Fatalf("replicas differ:\n%s\n%s", describe(a), describe(b))
		}
	})

	t.Run("replicas are reached only through the load balancer", func(t *testing.T) {
		for _, name := range replicas {
			if ports := service(t, p, name).Ports; len(ports) > 0 {
				t.Errorf("%s publishes %v; clients must go through lb", name, ports)
			}
		}
	})

	t.Run("replicas reach postgres and the channel by service name", func(t *testing.T) {
		env := environment(t, service(t, p, svcReplica1))
		pg := environment(t, service(t, p, svcPostgres))

		db, err := url.Parse(env["DATABASE_URL"])
		if err != nil {
			t.Fatalf("DATABASE_URL: %v", err)
		}
		if db.Scheme != "postgres" || db.Hostname() != svcPostgres || db.Port() != "5432" {
			t.Errorf("DATABASE_URL = %q, want postgres://…@%s:5432/…", env["DATABASE_URL"], svcPostgres)
		}
		if pass, _ := db.User.Password(); db.User.Username() != "postgres" || pass != pg["POSTGRES_PASSWORD"] {
			t.Errorf("DATABASE_URL credentials do not match the postgres service's POSTGRES_PASSWORD")
		}
		if strings.TrimPrefix(db.Path, "/") != pg["POSTGRES_DB"] || db.Query().Get("sslmode") != "disable" {
			t.Errorf("DATABASE_URL = %q, want database %q with sslmode=disable", env["DATABASE_URL"], pg["POSTGRES_DB"])
		}

		chDB, err := url.Parse(environment(t, service(t, p, svcChannel))["CHANNEL_DATABASE_URL"])
		if err != nil || chDB.Scheme != "postgres" || chDB.Hostname() != svcPostgres || chDB.Port() != "5432" ||
			strings.TrimPrefix(chDB.Path, "/") != "paymentchannel" || chDB.Query().Get("sslmode") != "disable" {
			t.Errorf("the channel's CHANNEL_DATABASE_URL = %v, want postgres://…@%s:5432/paymentchannel?sslmode=disable", chDB, svcPostgres)
		} else if pass, _ := chDB.User.Password(); chDB.User.Username() != "postgres" || pass != pg["POSTGRES_PASSWORD"] {
			t.Errorf("CHANNEL_DATABASE_URL credentials do not match the postgres service's POSTGRES_PASSWORD")
		}

		ch, err := url.Parse(env["PAYMENT_CHANNEL_URL"])
		if err != nil || ch.Scheme != "http" || ch.Host != svcChannel+":8081" {
			t.Errorf("PAYMENT_CHANNEL_URL = %q, want http://%s:8081", env["PAYMENT_CHANNEL_URL"], svcChannel)
		}
		if got := listenPort(t, environment(t, service(t, p, svcChannel))["HTTP_ADDR"]); got != "8081" {
			t.Errorf("the channel listens on %s, but the replicas call it on 8081", got)
		}
		if got := listenPort(t, env["HTTP_ADDR"]); got != "8080" {
			t.Errorf("replica HTTP_ADDR port = %s, want 8080 (nginx and prometheus use it)", got)
		}
		if !strings.Contains(env["API_KEYS"], "acme=demo-key-acme") || !strings.Contains(env["API_KEYS"], "globex=demo-key-globex") {
			t.Errorf("API_KEYS = %q, want the two demo tenants", env["API_KEYS"])
		}
	})

	t.Run("healthchecks probe the port each service listens on", func(t *testing.T) {
		probes := map[string]string{
			svcReplica1: "http://127.0.0.1:8080/readyz",
			svcReplica2: "http://127.0.0.1:8080/readyz",
			svcChannel:  "http://127.0.0.1:8081/healthz",
			svcLB:       "http://127.0.0.1:8080/healthz",
			svcLab:      "http://127.0.0.1:8090/healthz",
			svcJaeger:   "http://127.0.0.1:13133/status",
			svcGrafana:  "http://127.0.0.1:3000/api/health",
		}
		for name, want := range probes {
			test := service(t, p, name).HealthCheck.Test
			if test[0] != "CMD" || test[len(test)-1] != want {
				t.Errorf("%s healthcheck = %q, want CMD … %s", name, test, want)
			}
		}
		if test := service(t, p, svcPostgres).HealthCheck.Test; !slices.Contains(test, "pg_isready") {
			t.Errorf("postgres healthcheck = %q, want pg_isready", test)
		}
	})

	t.Run("the app services run binaries the image contains", func(t *testing.T) {
		bins := parseDockerfile(t).imageBinaries(t)
		for _, name := range append([]string{svcChannel, svcLab}, replicas...) {
			s := service(t, p, name)
			if s.Build == nil || filepath.Clean(s.Build.Context) != absRoot(t) || s.Build.Dockerfile != "Dockerfile" {
				t.Errorf("%s: build = %v, want the repository's Dockerfile", name, s.Build)
			}
			if test := s.HealthCheck.Test; len(test) > 1 && bins[test[1]] == "" {
				t.Errorf("%s: healthcheck runs %s, which the image does not contain (it has %v)", name, test[1], bins)
			}
			for _, bin := range s.Entrypoint {
				if bins[bin] == "" {
					t.Errorf("%s: entrypoint %s is not in the image (it has %v)", name, bin, bins)
				}
			}
		}
		if ep := service(t, p, svcChannel).Entrypoint; !slices.Equal(ep, []string{"/paymentchannel"}) {
			t.Errorf("paymentchannel entrypoint = %q, want [/paymentchannel]", ep)
		}
		if ep := service(t, p, svcLab).Entrypoint; !slices.Equal(ep, []string{"/lab"}) {
			t.Errorf("lab entrypoint = %q, want [/lab]", ep)
		}
		if ep := service(t, p, svcReplica1).Entrypoint; len(ep) != 0 {
			t.Errorf("replicas should use the image's ENTRYPOINT, not %q", ep)
		}
	})

	t.Run("the channel publishes 8081 for its admin endpoints, on loopback only", func(t *testing.T) {
		expectPublished(t, service(t, p, svcChannel), 8081)
		expectLoopbackOnly(t, service(t, p, svcChannel))
	})

	t.Run("NATS publishes 4222 on loopback only", func(t *testing.T) {
		expectPublished(t, service(t, p, svcNATS), 4222)
		expectLoopbackOnly(t, service(t, p, svcNATS))
	})

	// A teaching stack: the lab resets state and drives faults, Grafana
	// has a default admin, Jaeger takes any span. None is for the network.
	t.Run("every service publishes its ports on loopback only", func(t *testing.T) {
		for _, s := range p.Services {
			expectLoopbackOnly(t, s)
		}
	})

	t.Run("every published port moves with its variable, and keeps its default without", func(t *testing.T) {
		defaults := map[string]string{}
		for _, s := range p.Services {
			for _, port := range s.Ports {
				defaults[s.Name+":"+strconv.FormatUint(uint64(port.Target), 10)] = port.Published
			}
		}
		var env []string
		for i, v := range publishedPortVariables {
			env = append(env, fmt.Sprintf("%s=%d", v, 20001+i))
		}
		moved := loadComposeWith(t, env)
		seen := map[string]bool{}
		for _, s := range moved.Services {
			for _, port := range s.Ports {
				name := s.Name + ":" + strconv.FormatUint(uint64(port.Target), 10)
				n, _ := strconv.Atoi(port.Published)
				if n < 20001 || n >= 20001+len(publishedPortVariables) || seen[port.Published] {
					t.Errorf("%s is published on %s (default %s) whatever the variables say: give it a ${VAR:-%s}",
						name, port.Published, defaults[name], defaults[name])
					continue
				}
				seen[port.Published] = true
				if port.HostIP != "127.0.0.1" {
					t.Errorf("%s moved off loopback: %q", name, port.HostIP)
				}
			}
		}
		if len(seen) != len(publishedPortVariables) {
			t.Errorf("%d of the %d port variables move a port; the file's header lists every one that does", len(seen), len(publishedPortVariables))
		}
		raw, err := os.ReadFile(filepath.Join(repoRoot, "docker-compose.yml"))
		if err != nil {
			t.Fatal(err)
		}
		header, _, _ := strings.Cut(string(raw), "\nname:")
		for _, v := range publishedPortVariables {
			if !strings.Contains(header, v) {
				t.Errorf("the file's header does not name %s", v)
			}
		}
		jaeger := fmt.Sprintf("http://localhost:%d/", 20001+slices.Index(publishedPortVariables, "ORDERSERVICE_JAEGER_PORT"))
		if env := environment(t, service(t, moved, svcLab)); !strings.HasPrefix(env["LAB_TRACE_URL"], jaeger) {
			t.Errorf("the lab's links to traces do not follow the moved Jaeger port: LAB_TRACE_URL = %q", env["LAB_TRACE_URL"])
		}
	})

	t.Run("the image is built with the VERSION it is given, devel without", func(t *testing.T) {
		for _, name := range append([]string{svcChannel, svcLab}, replicas...) {
			// Loaded without the caller's environment: ${VERSION:-devel}.
			if got := buildArgs(t, service(t, p, name))["VERSION"]; got != "devel" {
				t.Errorf("%s: build argument VERSION = %q, want ${VERSION:-devel}, which is devel here", name, got)
			}
		}
	})

	t.Run("postgres keeps its data in a named volume", func(t *testing.T) {
		pg := service(t, p, svcPostgres)
		if len(pg.Volumes) != 1 || pg.Volumes[0].Type != types.VolumeTypeVolume || pg.Volumes[0].Target != "/var/lib/postgresql/data" {
			t.Fatalf("postgres volumes = %v", pg.Volumes)
		}
		if _, ok := p.Volumes[pg.Volumes[0].Source]; !ok {
			t.Errorf("volume %q is not declared", pg.Volumes[0].Source)
		}
		env := environment(t, pg)
		if env["POSTGRES_PASSWORD"] == "" || env["POSTGRES_DB"] != "orderservice" {
			t.Errorf("postgres environment = %v", env)
		}
	})

	t.Run("config files are mounted read-only from deploy/", func(t *testing.T) {
		// The config file first; prometheus also mounts its rules,
		// deploy/prometheus/ (TestPrometheusInComposeLoadsTheAlertRules).
		mounts := map[string]string{svcLB: "deploy/nginx.conf", svcPrometheus: "deploy/prometheus.yml"}
		count := map[string]int{svcLB: 1, svcPrometheus: 2}
		for name, file := range mounts {
			vols := service(t, p, name).Volumes
			want := filepath.Join(absRoot(t), file)
			if len(vols) != count[name] || vols[0].Type != types.VolumeTypeBind || vols[0].Source != want || !vols[0].ReadOnly {
				t.Errorf("%s volumes = %v, want %s bound read-only first, %d mounts in all", name, vols, file, count[name])
			}
			if fi := mustExist(t, file); !fi.Mode().IsRegular() {
				t.Errorf("%s is not a file", file)
			}
		}
	})
}

// publishedPortVariables move compose's published ports, one each.
var publishedPortVariables = []string{
	"ORDERSERVICE_API_PORT", "ORDERSERVICE_CHANNEL_PORT", "ORDERSERVICE_LAB_PORT", "ORDERSERVICE_NATS_PORT",
	"ORDERSERVICE_POSTGRES_PORT", "ORDERSERVICE_PROMETHEUS_PORT", "ORDERSERVICE_GRAFANA_PORT", "ORDERSERVICE_JAEGER_PORT",
	"ORDERSERVICE_OTLP_GRPC_PORT", "ORDERSERVICE_OTLP_HTTP_PORT",
}

func expectDependsOnHealthy(t *testing.T, s types.ServiceConfig, deps ...string) {
	t.Helper()
	for _, dep := range deps {
		d, ok := s.DependsOn[dep]
		if !ok {
			t.Errorf("%s does not depend on %s", s.Name, dep)
			continue
		}
		if d.Condition != types.ServiceConditionHealthy || !d.Required {
			t.Errorf("%s depends on %s with condition %q (required %v), want %s", s.Name, dep, d.Condition, d.Required, types.ServiceConditionHealthy)
		}
	}
}

func expectPublished(t *testing.T, s types.ServiceConfig, port uint32) {
	t.Helper()
	for _, p := range s.Ports {
		if p.Target == port && p.Published == strconv.FormatUint(uint64(port), 10) && (p.Protocol == "" || p.Protocol == "tcp") {
			return
		}
	}
	t.Errorf("%s does not publish %d:%d (ports %v)", s.Name, port, port, s.Ports)
}

// expectLoopbackOnly: every port s publishes is bound to 127.0.0.1, so
// only this machine reaches it (no authentication guards it).
func expectLoopbackOnly(t *testing.T, s types.ServiceConfig) {
	t.Helper()
	for _, p := range s.Ports {
		if p.HostIP != "127.0.0.1" {
			t.Errorf("%s publishes %s:%d on %q, want 127.0.0.1 only", s.Name, p.Published, p.Target, p.HostIP)
		}
	}
}

func listenPort(t *testing.T, addr string) string {
	t.Helper()
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatalf("listen address %q: %v", addr, err)
	}
	return port
}

func absRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(repoRoot)
	if err != nil {
		t.Fatal(err)
	}
	return root
}
