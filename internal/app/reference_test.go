package app_test

import (
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite docs/configuration.md from the configuration structs")

// referencePath is the configuration reference, generated from the
// configuration structs' tags and comments.
const referencePath = "../../docs/configuration.md"

// TestTheConfigurationReferenceIsCurrent fails when docs/configuration.md
// differs from what the configuration structs say, or when a setting has
// no comment to say what it is.
func TestTheConfigurationReferenceIsCurrent(t *testing.T) {
	var b strings.Builder
	b.WriteString(`# Configuration

Every setting is an environment variable, read once at start; an invalid
value stops the process with a one-line reason and exit status 1. This page
is generated from the configuration structs' tags and comments
(` + "`internal/app/config.go`, `internal/payment/channel/config.go`" + `):
` + "`go test ./internal/app -run Reference -update`" + ` rewrites it, and
` + "`make test`" + ` fails when it differs.

## orderservice

`)
	table(t, &b, "config.go")
	b.WriteString(`
## paymentchannel

The mock channel as its own binary (` + "`cmd/paymentchannel`" + `, the compose
stack's ` + "`channel`" + ` service). Embedded in the order service, the channel
takes its settings from the service's instead.

`)
	table(t, &b, "../payment/channel/config.go")
	want := b.String()
	if *update {
		if err := os.WriteFile(referencePath, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	got, err := os.ReadFile(referencePath)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != want {
		t.Errorf("docs/configuration.md differs from the configuration structs; run go test ./internal/app -run Reference -update")
	}
}

// table writes one row per field of the Config struct in file: its
// variable, its comment without the field's name, and its default.
func table(t *testing.T, b *strings.Builder, file string) {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), file, nil, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	var fields []*ast.Field
	ast.Inspect(f, func(n ast.Node) bool {
		if ts, ok := n.(*ast.TypeSpec); ok && ts.Name.Name == "Config" {
			fields = ts.Type.(*ast.StructType).Fields.List
		}
		return true
	})
	if len(fields) == 0 {
		t.Fatalf("%s: no Config struct", file)
	}
	b.WriteString("| variable | meaning | default |\n| --- | --- | --- |\n")
	for _, fd := range fields {
		name := fd.Names[0].Name
		tag, _ := strconv.Unquote(fd.Tag.Value)
		variable := reflect.StructTag(tag).Get("env")
		if fd.Doc == nil {
			t.Errorf("%s: %s (%s) has no comment to say what it is", file, name, variable)
			continue
		}
		var meaning []string
		def := "empty"
		if d, ok := reflect.StructTag(tag).Lookup("envDefault"); ok {
			def = "`" + d + "`"
		}
		for _, line := range strings.Split(strings.TrimSpace(fd.Doc.Text()), "\n") {
			if d, ok := strings.CutPrefix(line, "Default: "); ok {
				def = d
				continue
			}
			meaning = append(meaning, line)
		}
		text := strings.Join(meaning, " ")
		rest, ok := strings.CutPrefix(text, name+" ")
		if !ok {
			t.Errorf("%s: %s's comment does not begin with its name", file, name)
		}
		for _, verb := range []string{"is ", "are "} {
			rest = strings.TrimPrefix(rest, verb)
		}
		fmt.Fprintf(b, "| `%s` | %s | %s |\n", variable, strings.ReplaceAll(rest, "|", `\|`), def)
	}
}
