// Command docsgen writes docs/reference/helm-values.md, the reference of
// the Helm chart's values, from charts/vhostmq/values.schema.json (paths,
// types, allowed values, descriptions) and charts/vhostmq/values.yaml
// (defaults): one table per top-level value. It refuses a schema
// property without a description. Run it from anywhere in the
// repository after changing either file:
//
//	go run ./hack/docsgen        (or: make docs)
//
// `go test ./hack/docsgen` (part of `make test`) fails when the committed
// file differs from what this command writes.
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"
)

// The files, relative to the repository root.
const (
	schemaFile = "charts/vhostmq/values.schema.json"
	valuesFile = "charts/vhostmq/values.yaml"
	outFile    = "docs/reference/helm-values.md"
)

func main() {
	out := flag.String("o", "", "output file (default: "+outFile+" in the repository)")
	flag.Parse()
	root, err := repoRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, "docsgen:", err)
		os.Exit(1)
	}
	doc, err := generate(root)
	if err != nil {
		fmt.Fprintln(os.Stderr, "docsgen:", err)
		os.Exit(1)
	}
	path := *out
	if path == "" {
		path = filepath.Join(root, outFile)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		fmt.Fprintln(os.Stderr, "docsgen:", err)
		os.Exit(1)
	}
	if err := os.WriteFile(path, doc, 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "docsgen:", err)
		os.Exit(1)
	}
}

// repoRoot is the nearest directory from the working directory up that
// holds go.mod.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above the working directory: run it inside the repository")
		}
		dir = parent
	}
}

// generate renders the reference from the files under root.
func generate(root string) ([]byte, error) {
	schemaText, err := os.ReadFile(filepath.Join(root, schemaFile))
	if err != nil {
		return nil, err
	}
	valuesText, err := os.ReadFile(filepath.Join(root, valuesFile))
	if err != nil {
		return nil, err
	}
	return render(schemaText, valuesText)
}

// schema is the part of JSON Schema (draft-07) the chart's schema uses.
type schema struct {
	Type                 any                `json:"type"` // a name or a list of names
	Description          string             `json:"description"`
	Enum                 []any              `json:"enum"`
	Minimum              *json.Number       `json:"minimum"`
	Maximum              *json.Number       `json:"maximum"`
	MinLength            *int               `json:"minLength"`
	MaxLength            *int               `json:"maxLength"`
	Pattern              string             `json:"pattern"`
	UniqueItems          bool               `json:"uniqueItems"`
	Required             []string           `json:"required"`
	Ref                  string             `json:"$ref"`
	Items                *schema            `json:"items"`
	Properties           properties         `json:"properties"`
	AdditionalProperties json.RawMessage    `json:"additionalProperties"`
	Definitions          map[string]*schema `json:"definitions"`
}

// properties keeps the schema's order, which the tables follow.
type properties []property

type property struct {
	name string
	s    *schema
}

func (p *properties) UnmarshalJSON(b []byte) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return fmt.Errorf("properties: not an object")
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		var s schema
		if err := dec.Decode(&s); err != nil {
			return fmt.Errorf("%v: %w", tok, err)
		}
		*p = append(*p, property{name: tok.(string), s: &s})
	}
	return nil
}

// doc is the document being written, and the problems found.
type doc struct {
	buf    bytes.Buffer
	defs   map[string]*schema
	values *yaml.Node // values.yaml's top mapping
	errs   []error
}

func render(schemaText, valuesText []byte) ([]byte, error) {
	var root schema
	dec := json.NewDecoder(bytes.NewReader(schemaText))
	dec.UseNumber()
	if err := dec.Decode(&root); err != nil {
		return nil, fmt.Errorf("%s: %w", schemaFile, err)
	}
	var values yaml.Node
	if err := yaml.Unmarshal(valuesText, &values); err != nil {
		return nil, fmt.Errorf("%s: %w", valuesFile, err)
	}
	d := &doc{defs: root.Definitions}
	if len(values.Content) == 1 {
		d.values = values.Content[0]
	}
	d.header(root.Properties)
	for _, p := range root.Properties {
		d.section(p)
	}
	if len(d.errs) > 0 {
		return nil, fmt.Errorf("%s:\n%w", schemaFile, errors.Join(d.errs...))
	}
	return d.buf.Bytes(), nil
}

func (d *doc) printf(format string, args ...any) { fmt.Fprintf(&d.buf, format, args...) }

func (d *doc) header(top properties) {
	d.printf("<!-- Code generated by hack/docsgen from %s and %s. DO NOT EDIT.\n", schemaFile, valuesFile)
	d.printf("     Regenerate with `go run ./hack/docsgen` (make docs); go test ./hack/docsgen checks it. -->\n\n")
	d.printf("# Helm values\n\n")
	d.printf("The values of the chart in [`charts/vhostmq`](../../charts/vhostmq/): paths,\n")
	d.printf("types, allowed values and descriptions from\n")
	d.printf("[`values.schema.json`](../../%s), which refuses any other\n", schemaFile)
	d.printf("value, naming it; defaults from [`values.yaml`](../../%s).\n", valuesFile)
	d.printf("Set them with `helm install --set path=value` or `-f file.yaml`.\n\n")
	d.printf("A path `a[].b` is the field `b` of each item of the list `a`. The default\n")
	d.printf("is empty for an object whose fields follow it, and where `values.yaml` sets\n")
	d.printf("none.\n\n")
	for _, p := range top {
		d.printf("- [`%s`](#%s)\n", p.name, strings.ToLower(p.name))
	}
	d.printf("\n")
}

// section writes one top-level value: its description, then a table of
// it (a value without properties) or of everything under it.
func (d *doc) section(p property) {
	s := d.resolve(p.s)
	d.printf("## `%s`\n\n", p.name)
	if len(s.Properties) > 0 {
		d.need(p.name, p.s)
		d.printf("%s.\n\n", text(strings.TrimSuffix(p.s.Description, ".")))
	}
	d.printf("| path | type | default | allowed | description |\n|---|---|---|---|---|\n")
	if len(s.Properties) == 0 {
		d.row(p.name, p.s, false)
	} else {
		d.children(p.name, s)
	}
	d.printf("\n")
}

// children writes a row for each property under s, depth first.
func (d *doc) children(path string, s *schema) {
	for _, c := range s.Properties {
		cpath := path + "." + c.name
		d.row(cpath, c.s, slices.Contains(s.Required, c.name))
		cs := d.resolve(c.s)
		d.children(cpath, cs)
		if cs.Items != nil && len(cs.Items.Properties) > 0 {
			d.children(cpath+"[]", cs.Items)
		}
	}
}

func (d *doc) need(path string, s *schema) {
	if strings.TrimSpace(s.Description) == "" {
		d.errs = append(d.errs, fmt.Errorf("%s: no description (add one to the schema)", path))
	}
}

// resolve follows a $ref to the definitions.
func (d *doc) resolve(s *schema) *schema {
	if s.Ref == "" {
		return s
	}
	name := strings.TrimPrefix(s.Ref, "#/definitions/")
	if def, ok := d.defs[name]; ok {
		return def
	}
	d.errs = append(d.errs, fmt.Errorf("$ref %s: no such definition", s.Ref))
	return s
}

func (d *doc) row(path string, s *schema, required bool) {
	d.need(path, s)
	r := d.resolve(s)
	allowed := constraints(r)
	if s.Ref != "" && r.Description != "" {
		allowed = append([]string{text(r.Description)}, allowed...)
	}
	if required {
		allowed = append([]string{"required"}, allowed...)
	}
	d.printf("| %s | %s | %s | %s | %s |\n", code(path), typeOf(r), d.defaultOf(path, r), strings.Join(allowed, "; "), text(s.Description))
}

// typeOf names the type: the schema's, or the enum values', with the
// items' for an array.
func typeOf(s *schema) string {
	t := ""
	switch v := s.Type.(type) {
	case string:
		t = v
	case []any:
		var names []string
		for _, n := range v {
			names = append(names, fmt.Sprint(n))
		}
		t = strings.Join(names, " or ")
	}
	if t == "" && len(s.Enum) > 0 {
		switch s.Enum[0].(type) {
		case string:
			t = "string"
		case json.Number, float64:
			t = "number"
		case bool:
			t = "boolean"
		}
	}
	if t == "array" && s.Items != nil {
		if it := typeOf(s.Items); it != "" {
			t = "array of " + it
		}
	}
	return t
}

// constraints says what the schema allows, one phrase per keyword.
func constraints(s *schema) []string {
	var out []string
	if len(s.Enum) > 0 {
		var vs []string
		for _, v := range s.Enum {
			vs = append(vs, code(fmt.Sprint(v)))
		}
		out = append(out, strings.Join(vs, ", "))
	}
	switch {
	case s.Minimum != nil && s.Maximum != nil:
		out = append(out, fmt.Sprintf("%s..%s", s.Minimum, s.Maximum))
	case s.Minimum != nil:
		out = append(out, fmt.Sprintf("≥ %s", s.Minimum))
	case s.Maximum != nil:
		out = append(out, fmt.Sprintf("≤ %s", s.Maximum))
	}
	if s.MinLength != nil && *s.MinLength == 1 {
		out = append(out, "non-empty")
	} else if s.MinLength != nil && *s.MinLength > 1 {
		out = append(out, fmt.Sprintf("at least %d characters", *s.MinLength))
	}
	if s.MaxLength != nil {
		out = append(out, fmt.Sprintf("at most %d characters", *s.MaxLength))
	}
	if s.Pattern != "" {
		out = append(out, "matches "+code(s.Pattern))
	}
	if s.UniqueItems {
		out = append(out, "unique items")
	}
	if len(s.Properties) == 0 && len(s.Required) > 0 {
		var rs []string
		for _, r := range s.Required {
			rs = append(rs, code(r))
		}
		out = append(out, "needs "+strings.Join(rs, ", "))
	}
	var ap schema
	if len(s.AdditionalProperties) > 0 && json.Unmarshal(s.AdditionalProperties, &ap) == nil && typeOf(&ap) != "" {
		out = append(out, typeOf(&ap)+" values")
	}
	if s.Items != nil && len(s.Items.Properties) == 0 {
		if ic := constraints(s.Items); len(ic) > 0 {
			out = append(out, "items: "+strings.Join(ic, ", "))
		}
	}
	return out
}

// defaultOf is path's value in values.yaml in YAML flow style, or empty
// for an object the table details below it, or where values.yaml has
// none.
func (d *doc) defaultOf(path string, s *schema) string {
	if len(s.Properties) > 0 || strings.Contains(path, "[]") {
		return ""
	}
	n := d.values
	for _, key := range strings.Split(path, ".") {
		n = lookup(n, key)
		if n == nil {
			return ""
		}
	}
	flow := *n
	setFlow(&flow)
	flow.HeadComment, flow.LineComment, flow.FootComment = "", "", ""
	b, err := yaml.Marshal(&flow)
	if err != nil {
		d.errs = append(d.errs, fmt.Errorf("%s: default: %w", path, err))
		return ""
	}
	// flow style: a line break the encoder put in is a space
	return code(strings.TrimSpace(lineBreak.ReplaceAllString(string(b), " ")))
}

func lookup(m *yaml.Node, key string) *yaml.Node {
	if m == nil || m.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			return m.Content[i+1]
		}
	}
	return nil
}

// setFlow makes n and what it holds flow style, without comments.
func setFlow(n *yaml.Node) {
	if n.Kind == yaml.MappingNode || n.Kind == yaml.SequenceNode {
		n.Style |= yaml.FlowStyle
		content := make([]*yaml.Node, len(n.Content))
		for i, c := range n.Content {
			cc := *c
			cc.HeadComment, cc.LineComment, cc.FootComment = "", "", ""
			setFlow(&cc)
			content[i] = &cc
		}
		n.Content = content
	}
}

var lineBreak = regexp.MustCompile(`\s*\n\s*`)

// code is s as a code span in a table cell.
func code(s string) string {
	fence := "`"
	if strings.Contains(s, "`") {
		fence = "``"
		s = " " + s + " "
	}
	return fence + strings.ReplaceAll(s, "|", `\|`) + fence
}

// text is prose in a table cell: no table pipes, no HTML tags (<release>
// stays as written), no emphasis.
func text(s string) string {
	return strings.NewReplacer("|", `\|`, "<", "&lt;", "*", `\*`).Replace(s)
}
