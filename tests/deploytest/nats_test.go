package deploytest

import (
	"bytes"
	"context"
	"errors"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/compose-spec/compose-go/v2/types"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/orderservice/orderservice/internal/app"
	"github.com/orderservice/orderservice/internal/messaging"
	"github.com/orderservice/orderservice/tests/testproc"
)

// natsConf loads deploy/nats.conf the way nats-server does.
func natsConf(t *testing.T) *server.Options {
	t.Helper()
	opts, err := server.ProcessConfigFile(filepath.Join(repoRoot, "deploy", "nats.conf"))
	if err != nil {
		t.Fatalf("deploy/nats.conf: %v", err)
	}
	return opts
}

// startNATSFromConf runs a NATS server from deploy/nats.conf in this
// process, on a free loopback port with a store of its own.
func startNATSFromConf(t *testing.T) *server.Server {
	t.Helper()
	opts := natsConf(t)
	opts.Port, opts.HTTPPort, opts.Host, opts.StoreDir, opts.NoLog, opts.NoSigs = server.RANDOM_PORT, 0, "127.0.0.1", t.TempDir(), true, true
	srv, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server from deploy/nats.conf did not start")
	}
	t.Cleanup(srv.Shutdown)
	return srv
}

// loopbackNATSURL is composeURL (credentials and all) pointed at srv.
func loopbackNATSURL(t *testing.T, composeURL string, srv *server.Server) string {
	t.Helper()
	u, err := url.Parse(composeURL)
	if err != nil {
		t.Fatal(err)
	}
	u.Host = strings.TrimPrefix(srv.ClientURL(), "nats://")
	return u.String()
}

func TestNATSConfiguration(t *testing.T) {
	p := loadCompose(t)
	opts := natsConf(t)
	env := environment(t, service(t, p, svcReplica1))
	cfg, err := app.LoadConfig(env)
	if err != nil {
		t.Fatal(err)
	}
	users := map[string]*server.User{}
	for _, u := range opts.Users {
		users[u.Username] = u
	}

	t.Run("JetStream is on and keeps its store in the mounted volume", func(t *testing.T) {
		if !opts.JetStream || opts.StoreDir != "/data" || opts.Port != 4222 || opts.HTTPPort != 8222 {
			t.Errorf("jetstream %v store %q port %d http %d", opts.JetStream, opts.StoreDir, opts.Port, opts.HTTPPort)
		}
		nats := service(t, p, svcNATS)
		var conf, data bool
		for _, v := range nats.Volumes {
			conf = conf || (v.Type == types.VolumeTypeBind && v.Source == filepath.Join(absRoot(t), "deploy/nats.conf") && v.ReadOnly)
			data = data || (v.Type == types.VolumeTypeVolume && v.Target == "/data")
		}
		if !conf || !data {
			t.Errorf("nats volumes = %v, want deploy/nats.conf read-only and a named volume on /data", nats.Volumes)
		}
		if test := nats.HealthCheck.Test; !strings.Contains(test[len(test)-1], ":8222/healthz") {
			t.Errorf("nats healthcheck = %q", test)
		}
	})
	t.Run("every tenant of API_KEYS is a user with its key and exactly the embedded server's permissions", func(t *testing.T) {
		for tenant, key := range cfg.APIKeys {
			u := users[tenant]
			if u == nil || u.Password != key {
				t.Errorf("tenant %s: no user with its API key", tenant)
				continue
			}
			want := messaging.TenantPermissions(tenant)
			if !slices.Equal(u.Permissions.Publish.Allow, want.Publish.Allow) || !slices.Equal(u.Permissions.Subscribe.Allow, want.Subscribe.Allow) {
				t.Errorf("tenant %s: permissions %+v %+v, want %+v %+v", tenant, u.Permissions.Publish, u.Permissions.Subscribe, want.Publish, want.Subscribe)
			}
		}
		if len(users) != len(cfg.APIKeys)+1 {
			t.Errorf("%d users, want one per tenant and the service's", len(users))
		}
	})
	t.Run("the replicas' NATS_URL names the nats service and the service's user", func(t *testing.T) {
		u, err := url.Parse(cfg.NATS.URL)
		if err != nil || u.Hostname() != svcNATS || u.Port() != "4222" {
			t.Fatalf("NATS_URL = %q", cfg.NATS.URL)
		}
		pass, _ := u.User.Password()
		if svc := users[u.User.Username()]; svc == nil || svc.Password != pass || svc.Permissions != nil {
			t.Errorf("NATS_URL's user %q is not the unrestricted service user of nats.conf", u.User.Username())
		}
	})

	t.Run("the lab plays the broker lessons on the nats service, as its tenant's user and as the operator", func(t *testing.T) {
		lab := service(t, p, svcLab)
		expectDependsOnHealthy(t, lab, svcNATS)
		env := environment(t, lab)
		if u, err := url.Parse(env["LAB_NATS_URL"]); err != nil || u.Scheme != "nats" || u.Host != svcNATS+":4222" || u.User != nil {
			t.Errorf("LAB_NATS_URL = %q, want nats://%s:4222 without credentials", env["LAB_NATS_URL"], svcNATS)
		}
		if u := users[env["LAB_TENANT"]]; u == nil || u.Password != env["LAB_API_KEY"] || u.Password != cfg.APIKeys[env["LAB_TENANT"]] {
			t.Errorf("LAB_TENANT %q with LAB_API_KEY as password is not a tenant user of nats.conf", env["LAB_TENANT"])
		}
		user, pass, _ := strings.Cut(env["LAB_NATS_OPERATOR"], ":")
		if svc := users[user]; svc == nil || svc.Password != pass || svc.Permissions != nil {
			t.Errorf("LAB_NATS_OPERATOR's user %q is not the unrestricted service user of nats.conf", user)
		}
	})

	t.Run("a server run from the file refuses a tenant another tenant's prefix", func(t *testing.T) {
		srv := startNATSFromConf(t)
		nc, err := nats.Connect(loopbackNATSURL(t, cfg.NATS.URL, srv))
		if err != nil {
			t.Fatalf("the service's credentials: %v", err)
		}
		defer nc.Close()
		js, _ := jetstream.New(nc)
		if _, err := messaging.EnsureStreams(context.Background(), js, messaging.StreamWindows{Redelivery: time.Hour, Compensation: time.Hour}); err != nil {
			t.Fatalf("the service cannot create its streams: %v", err)
		}

		violations := make(chan error, 1)
		acme, err := nats.Connect(srv.ClientURL(), nats.UserInfo("acme", cfg.APIKeys["acme"]), nats.CustomInboxPrefix(messaging.InboxPrefix("acme")),
			nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { violations <- err }))
		if err != nil {
			t.Fatal(err)
		}
		defer acme.Close()
		ajs, _ := jetstream.New(acme)
		if _, err := ajs.Publish(context.Background(), messaging.CommandSubject("acme", "create"), []byte("{}")); err != nil {
			t.Errorf("acme on its own prefix: %v", err)
		}
		// Another tenant's subject, and one of its own prefix that names
		// no operation: the broker refuses both.
		for _, subject := range []string{messaging.CommandSubject("globex", "create"), messaging.CommandSubject("acme", "refund")} {
			_ = acme.Publish(subject, []byte("{}"))
			_ = acme.Flush()
			select {
			case err := <-violations:
				if !errors.Is(err, nats.ErrPermissionViolation) && !strings.Contains(strings.ToLower(err.Error()), "permissions violation") {
					t.Errorf("%s: err = %v", subject, err)
				}
			case <-time.After(30 * time.Second):
				t.Fatalf("the broker accepted acme's publish on %s", subject)
			}
		}
	})
}

// What a learner starts with `docker compose up` is the broker the tests
// prove: compose's nats service runs the project's image as /nats-server,
// built from go.mod's nats-server module, the one every test embeds; it
// starts from deploy/nats.conf with compose's command, and compose's
// healthcheck (the image's probe: distroless has no wget) sees it healthy.
func TestComposeRunsTheNATSServerOfGoMod(t *testing.T) {
	p := loadCompose(t)
	nats, replica := service(t, p, svcNATS), service(t, p, svcReplica1)
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Version}}", natsServerModule).Output()
	if err != nil {
		t.Fatalf("go list -m %s: %v", natsServerModule, err)
	}
	goMod := strings.TrimSpace(string(out))

	t.Run("the tests run go.mod's server", func(t *testing.T) {
		if "v"+server.VERSION != goMod {
			t.Errorf("the tests embed nats-server %s, go.mod requires %s", server.VERSION, goMod)
		}
	})
	t.Run("compose runs the project's image as /nats-server, built from that module", func(t *testing.T) {
		if nats.Image != replica.Image || nats.Build == nil || !slices.Equal(nats.Entrypoint, []string{"/nats-server"}) {
			t.Errorf("nats: image %q (build %v), entrypoint %q; want the replicas' image %q and /nats-server", nats.Image, nats.Build != nil, nats.Entrypoint, replica.Image)
		}
		if pkg := parseDockerfile(t).imageBinaries(t)["/nats-server"]; pkg != natsServerModule {
			t.Errorf("the image's /nats-server is built from %q, want %s at go.mod's version (no @version)", pkg, natsServerModule)
		}
	})
	t.Run("that binary is go.mod's version, starts with compose's command and is healthy to compose", func(t *testing.T) {
		bins := buildImageBinaries(t, buildArgs(t, nats), "/nats-server", "/healthcheck")
		version, err := exec.Command(bins["/nats-server"], "--version").Output()
		if err != nil || strings.TrimSpace(string(version)) != "nats-server: "+goMod {
			t.Fatalf("/nats-server --version = %q, %v; want nats-server: %s", version, err, goMod)
		}
		// compose's command and deploy/nats.conf, with what compose itself
		// provides (the /data volume, the ports) in a directory and on
		// loopback ports of the test's.
		conf, err := os.ReadFile(filepath.Join(repoRoot, "deploy", "nats.conf"))
		if err != nil {
			t.Fatal(err)
		}
		dir := t.TempDir()
		confPath := filepath.Join(dir, "nats.conf")
		if err := os.WriteFile(confPath, []byte(strings.Replace(string(conf), "store_dir: /data", "store_dir: "+strconv.Quote(filepath.Join(dir, "data")), 1)), 0o600); err != nil {
			t.Fatal(err)
		}
		args := slices.Clone(nats.Command)
		if i := slices.Index(args, "/etc/nats/nats.conf"); i >= 0 {
			args[i] = confPath
		}
		client, monitor := testproc.FreeAddr(t), testproc.FreeAddr(t)
		args = append(args, "-a", "127.0.0.1", "-p", listenPort(t, client), "-m", listenPort(t, monitor))
		cmd := exec.Command(bins["/nats-server"], args...)
		var said bytes.Buffer
		cmd.Stdout, cmd.Stderr = &said, &said
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		probe := nats.HealthCheck.Test[len(nats.HealthCheck.Test)-1]
		probe = strings.Replace(probe, "127.0.0.1:8222", monitor, 1)
		if nats.HealthCheck.Test[1] != "/healthcheck" {
			t.Fatalf("nats healthcheck = %q, want the image's /healthcheck", nats.HealthCheck.Test)
		}
		var code int
		var probed string
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			if code, probed = runHealthcheck(t, bins["/healthcheck"], probe); code == 0 {
				return
			}
		}
		_ = cmd.Process.Kill()
		_ = cmd.Wait() // said is whole, and ours to read, once the process is gone
		t.Errorf("compose's healthcheck %s: exit %d, %s; the server said: %s", probe, code, probed, said.String())
	})
}
