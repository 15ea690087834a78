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
// differs from what the configuration structs say, or when a setting or a
// group has no comment to say what it is.
func TestTheConfigurationReferenceIsCurrent(t *testing.T) {
	var b strings.Builder
	b.WriteString(`# Configuration

Every setting is an environment variable, read once at start; an invalid
value stops the process with a one-line reason and exit status 1. This page
is generated from the configuration structs' tags and comments
(` + "`internal/app/config.go`, `internal/payment/mockchannel/config.go`" + `):
` + "`go test ./internal/app -run Reference -update`" + ` rewrites it, and
` + "`make test`" + ` fails when it differs.

## orderservice

`)
	table(t, &b, "config.go")
	b.WriteString(`
## paymentchannel

The mock channel as its own binary (` + "`cmd/paymentchannel`" + `, the compose
stack's ` + "`channel`" + ` service). Embedded in the order service, the channel
takes its settings from the service's instead (its key window is
` + "`PAYMENT_CHANNEL_KEY_WINDOW`" + ` there; ` + "`CHANNEL_KEY_WINDOW`" + ` set on the service does
nothing).

`)
	table(t, &b, "../payment/mockchannel/config.go")
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

// table writes the settings of the Config struct in file: one row per
// field with an env tag (its variable, its comment without the field's
// name, its default), and for each group (a field whose type is another
// struct of the file) a section of its own, its comment the section's text.
// A group's envPrefix goes before its variables' names, and a group within
// a group adds its rows, prefixed, to its parent's section.
func table(t *testing.T, b *strings.Builder, file string) {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), file, nil, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	structs := map[string]*ast.StructType{}
	ast.Inspect(f, func(n ast.Node) bool {
		if ts, ok := n.(*ast.TypeSpec); ok {
			if st, ok := ts.Type.(*ast.StructType); ok {
				structs[ts.Name.Name] = st
			}
		}
		return true
	})
	if structs["Config"] == nil {
		t.Fatalf("%s: no Config struct", file)
	}
	var top strings.Builder
	var sections []string
	for _, fd := range structs["Config"].Fields.List {
		group, prefix := groupOf(fd, structs)
		if group == nil {
			row(t, &top, file, fd, "")
			continue
		}
		var sec strings.Builder
		fmt.Fprintf(&sec, "\n### %s\n\n%s\n\n", fd.Names[0].Name, capitalize(meaning(t, file, fd)))
		sec.WriteString(tableHeader)
		rows(t, &sec, file, group, prefix, structs)
		sections = append(sections, sec.String())
	}
	if top.Len() > 0 {
		b.WriteString(tableHeader + top.String())
	}
	for _, sec := range sections {
		b.WriteString(sec)
	}
}

const tableHeader = "| variable | meaning | default |\n| --- | --- | --- |\n"

// rows writes a row for each setting of a group, its subgroups' included.
func rows(t *testing.T, b *strings.Builder, file string, st *ast.StructType, prefix string, structs map[string]*ast.StructType) {
	t.Helper()
	for _, fd := range st.Fields.List {
		if group, own := groupOf(fd, structs); group != nil {
			meaning(t, file, fd) // a subgroup says what it is too
			rows(t, b, file, group, prefix+own, structs)
			continue
		}
		row(t, b, file, fd, prefix)
	}
}

// groupOf is the struct a group field holds and its envPrefix; nil for a
// setting.
func groupOf(fd *ast.Field, structs map[string]*ast.StructType) (*ast.StructType, string) {
	id, ok := fd.Type.(*ast.Ident)
	if !ok || structs[id.Name] == nil {
		return nil, ""
	}
	prefix := ""
	if fd.Tag != nil {
		tag, _ := strconv.Unquote(fd.Tag.Value)
		prefix = reflect.StructTag(tag).Get("envPrefix")
	}
	return structs[id.Name], prefix
}

// row writes a setting's row: its variable, its comment without the
// field's name, and its default.
func row(t *testing.T, b *strings.Builder, file string, fd *ast.Field, prefix string) {
	t.Helper()
	name := fd.Names[0].Name
	if fd.Tag == nil {
		t.Errorf("%s: %s is neither a setting (no env tag) nor a group", file, name)
		return
	}
	tag, _ := strconv.Unquote(fd.Tag.Value)
	own, _, _ := strings.Cut(reflect.StructTag(tag).Get("env"), ",")
	variable := prefix + own
	if fd.Doc == nil {
		t.Errorf("%s: %s (%s) has no comment to say what it is", file, name, variable)
		return
	}
	def := "empty"
	if d, ok := reflect.StructTag(tag).Lookup("envDefault"); ok {
		def = "`" + d + "`"
	}
	for _, line := range strings.Split(strings.TrimSpace(fd.Doc.Text()), "\n") {
		if d, ok := strings.CutPrefix(line, "Default: "); ok {
			def = d
		}
	}
	fmt.Fprintf(b, "| `%s` | %s | %s |\n", variable, strings.ReplaceAll(meaning(t, file, fd), "|", `\|`), def)
}

// meaning is a field's comment on one line, without its "Default:" line
// and without the field's name and verb it begins with.
func meaning(t *testing.T, file string, fd *ast.Field) string {
	t.Helper()
	name := fd.Names[0].Name
	if fd.Doc == nil {
		t.Errorf("%s: %s has no comment to say what it is", file, name)
		return ""
	}
	var lines []string
	for _, line := range strings.Split(strings.TrimSpace(fd.Doc.Text()), "\n") {
		if !strings.HasPrefix(line, "Default: ") {
			lines = append(lines, line)
		}
	}
	rest, ok := strings.CutPrefix(strings.Join(lines, " "), name+" ")
	if !ok {
		t.Errorf("%s: %s's comment does not begin with its name", file, name)
	}
	for _, verb := range []string{"is ", "are "} {
		rest = strings.TrimPrefix(rest, verb)
	}
	return rest
}

// capitalize makes a comment's remainder a sentence.
func capitalize(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}
