package lessons

import (
	"flag"
	"time"
)

// RegisterFlags declares, on fs, the flags every front end of the lessons
// takes (the system it talks to), each defaulting to the environment
// variable prefix+NAME and then to what `make run` starts.
func (c *Config) RegisterFlags(fs *flag.FlagSet, prefix string, getenv func(string) string) {
	orDefault := func(env, def string) string {
		if v := getenv(prefix + env); v != "" {
			return v
		}
		return def
	}
	fs.StringVar(&c.BaseURL, "url", orDefault("SERVICE_URL", "http://localhost:8080"), "base URL of the order service (env "+prefix+"SERVICE_URL)")
	fs.StringVar(&c.ChannelURL, "channel", orDefault("CHANNEL_URL", "http://127.0.0.1:8081"), "base URL of the payment channel's admin API (env "+prefix+"CHANNEL_URL)")
	fs.StringVar(&c.APIKey, "api-key", orDefault("API_KEY", "demo-key-acme"), "API key of the tenant to play as (env "+prefix+"API_KEY)")
	fs.StringVar(&c.Tenant, "tenant", orDefault("TENANT", "acme"), "the tenant the API key belongs to: its NATS user (env "+prefix+"TENANT)")
	fs.StringVar(&c.NeighbourAPIKey, "neighbour-api-key", orDefault("NEIGHBOUR_API_KEY", "demo-key-globex"), "API key of another tenant, the quiet one beside a flood (env "+prefix+"NEIGHBOUR_API_KEY)")
	fs.StringVar(&c.NeighbourTenant, "neighbour-tenant", orDefault("NEIGHBOUR_TENANT", "globex"), "the tenant the neighbour's API key belongs to (env "+prefix+"NEIGHBOUR_TENANT)")
	fs.StringVar(&c.NATSURL, "nats-url", orDefault("NATS_URL", "nats://127.0.0.1:4223"), "the service's NATS server; `make run` embeds one on 127.0.0.1:4223 (env "+prefix+"NATS_URL)")
	fs.StringVar(&c.NATSOperator, "nats-operator", orDefault("NATS_OPERATOR", "orderservice:orderservice-dev-secret"),
		"user:password of the service's NATS user, for the operator's steps (DLQ replay, an event republished); empty shows them instead (env "+prefix+"NATS_OPERATOR)")
	fs.StringVar(&c.NaiveDatabaseURL, "naive-database", orDefault("NAIVE_DATABASE_URL", "postgres://postgres:postgres@localhost:5432/naiveorders?sslmode=disable"),
		"PostgreSQL for the pitfall lessons' naive service, which runs in this process (the database is created if missing) (env "+prefix+"NAIVE_DATABASE_URL)")
	fs.StringVar(&c.TraceURL, "trace-url", orDefault("TRACE_URL", ""),
		"a trace UI's URL with {trace_id}, e.g. http://localhost:16686/trace/{trace_id}: each request then carries a traceparent and links to its trace (env "+prefix+"TRACE_URL)")
	fs.DurationVar(&c.SweepWait, "sweep-wait", 45*time.Second, "how long the takeover lesson waits for the service's sweeper")
}
