package docscheck

import (
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"html"
	"io/fs"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"unicode"

	reporoot "github.com/vhostmq/vhostmq/internal/repo"
)

// What is read, relative to the repository root.
var (
	// Where an annotation or a metric counts as documented: these and
	// every .md file under docsDir.
	documentedIn = []string{"README.md"}
	docsDir      = "docs"
	// More Markdown whose links resolve and whose vhostmq.io/ and
	// vhostmq_ names exist in the code.
	alsoChecked = []string{"charts/README.md", "cni/README.md", "plugin/README.md",
		"deploy/README.md", "deploy/examples/README.md", "hack/cluster/README.md", "hack/kubevirt/README.md", "test/e2e/README.md",
		"CHANGELOG.md"}
	// The metrics reference: where each metric must be documented once
	// it exists (until then, anywhere in documentedIn and docsDir).
	metricsReference = "docs/reference/metrics.md"
)

// nonAnnotations are vhostmq.io/ names in the code that are not
// annotations; any other such string literal must be an Annotation*
// constant, so that this check sees it.
var nonAnnotations = map[string]string{
	"vhostmq.io/queue-pairs": "the device plugin's extended resource",
}

// ---- the repository ----

type mdFile struct {
	path  string // from the root, slash-separated
	lines []string
}

type repo struct {
	root       string
	documented []*mdFile // documentedIn and docsDir
	checked    []*mdFile // documented and alsoChecked
	code       *codeFacts
	missing    []string // listed above and absent
}

var (
	loadOnce sync.Once
	loaded   *repo
	loadErr  error
)

// load reads the repository once for all the tests.
func load(t *testing.T) *repo {
	t.Helper()
	loadOnce.Do(func() { loaded, loadErr = readRepo() })
	if loadErr != nil {
		t.Fatal(loadErr)
	}
	return loaded
}

func readRepo() (*repo, error) {
	root, err := reporoot.Root()
	if err != nil {
		return nil, err
	}
	r := &repo{root: root}
	var docs []string
	docs = append(docs, documentedIn...)
	err = filepath.WalkDir(filepath.Join(root, docsDir), func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasSuffix(p, ".md") {
			rel, _ := filepath.Rel(root, p)
			docs = append(docs, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("reading %s/: %w", docsDir, err)
	}
	for _, p := range append(docs, alsoChecked...) {
		f, err := readMarkdown(root, p)
		if errors.Is(err, fs.ErrNotExist) {
			r.missing = append(r.missing, p)
			continue
		} else if err != nil {
			return nil, err
		}
		if slices.Contains(docs, p) {
			r.documented = append(r.documented, f)
		}
		r.checked = append(r.checked, f)
	}
	r.code, err = readCode(root)
	return r, err
}

func readMarkdown(root, rel string) (*mdFile, error) {
	b, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(rel)))
	if err != nil {
		return nil, err
	}
	return &mdFile{path: rel, lines: strings.Split(string(b), "\n")}, nil
}

// ---- failures ----

type failure struct {
	file string
	line int
	msg  string
}

type failures []failure

func (fs *failures) add(file string, line int, format string, args ...any) {
	*fs = append(*fs, failure{file, line, fmt.Sprintf(format, args...)})
}

// report fails t with every failure, one per line, by file and line.
func (fs failures) report(t *testing.T, what string) {
	t.Helper()
	if len(fs) == 0 {
		return
	}
	sort.SliceStable(fs, func(i, j int) bool {
		if fs[i].file != fs[j].file {
			return fs[i].file < fs[j].file
		}
		return fs[i].line < fs[j].line
	})
	var b strings.Builder
	fmt.Fprintf(&b, "%d %s:\n", len(fs), what)
	for _, f := range fs {
		if f.line > 0 {
			fmt.Fprintf(&b, "%s:%d: %s\n", f.file, f.line, f.msg)
		} else {
			fmt.Fprintf(&b, "%s: %s\n", f.file, f.msg)
		}
	}
	t.Error(b.String())
}

// ---- the code ----

// pos is a place in the code.
type pos struct {
	file string
	line int
}

type codeFacts struct {
	// annotations are the Annotation* constants' keys
	annotations map[string][]pos
	// keyLiterals are string literals that are exactly a vhostmq.io/ name
	keyLiterals map[string][]pos
	// names are the vhostmq.io/ names anywhere in the code's strings
	names map[string]bool
	// metrics are the vhostmq_ metric names
	metrics map[string]pos
	// otherNames are vhostmq_ string literals that are not metrics
	// (eBPF map and program names)
	otherNames map[string]bool
}

var (
	annotationKey = regexp.MustCompile(`^(vhostmq\.io/[a-z0-9][a-z0-9.-]*|kubernetes\.io/[a-z][a-z-]*-bandwidth)$`)
	vhostmqName   = regexp.MustCompile(`(?:^|[^A-Za-z0-9./-])(vhostmq\.io/[A-Za-z0-9][A-Za-z0-9._-]*)`)
	bandwidthName = regexp.MustCompile(`(?:^|[^A-Za-z0-9./-])(kubernetes\.io/[a-z][a-z-]*-bandwidth)`)
	metricLiteral = regexp.MustCompile(`^vhostmq_[a-z0-9_]+$`)
)

// call is a call of a function of the same package by its name.
type call struct {
	callee string // pkgdir.name
	caller string // pkgdir.name of the enclosing function, or ""
	params []string
	args   []ast.Expr
	at     pos
}

// readCode parses the non-test Go files that mention vhostmq.
func readCode(root string) (*codeFacts, error) {
	c := &codeFacts{annotations: map[string][]pos{}, keyLiterals: map[string][]pos{}, names: map[string]bool{},
		metrics: map[string]pos{}, otherNames: map[string]bool{}}
	literals := map[string]pos{} // vhostmq_ literals
	ctors := map[string]int{}    // metric constructors: the parameter "vhostmq_" is prepended to
	var calls []call
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if p != root && (strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || name == "testdata" || name == "vendor" || name == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if !strings.Contains(string(src), "vhostmq") && !strings.Contains(string(src), "-bandwidth") {
			return nil
		}
		rel, _ := filepath.Rel(root, p)
		rel = filepath.ToSlash(rel)
		f, err := parser.ParseFile(fset, rel, src, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		pkg := path.Dir(rel)
		at := func(n ast.Node) pos { return pos{rel, fset.Position(n.Pos()).Line} }
		// constants
		for _, decl := range f.Decls {
			gd, ok := decl.(*ast.GenDecl)
			if !ok || gd.Tok != token.CONST {
				continue
			}
			for _, spec := range gd.Specs {
				vs := spec.(*ast.ValueSpec)
				for i, id := range vs.Names {
					if i >= len(vs.Values) || !strings.Contains(id.Name, "Annotation") {
						continue
					}
					if v, ok := stringLit(vs.Values[i]); ok && annotationKey.MatchString(v) {
						c.annotations[v] = append(c.annotations[v], at(vs.Values[i]))
					}
				}
			}
		}
		// literals, metric constructors and their calls
		for _, decl := range f.Decls {
			// the function a call is in, if a plain function
			fn, _ := decl.(*ast.FuncDecl)
			var params []string
			if fn != nil && fn.Recv != nil {
				fn = nil
			}
			if fn != nil {
				for _, fld := range fn.Type.Params.List {
					for _, id := range fld.Names {
						params = append(params, id.Name)
					}
				}
			}
			ast.Inspect(decl, func(n ast.Node) bool {
				switch n := n.(type) {
				case *ast.BasicLit:
					v, ok := stringLit(n)
					if !ok {
						break
					}
					for _, m := range vhostmqName.FindAllStringSubmatch(v, -1) {
						c.names[trimName(m[1])] = true
					}
					for _, m := range bandwidthName.FindAllStringSubmatch(v, -1) {
						c.names[m[1]] = true
					}
					if strings.HasPrefix(v, "vhostmq.io/") && annotationKey.MatchString(v) {
						c.keyLiterals[v] = append(c.keyLiterals[v], at(n))
					}
					if metricLiteral.MatchString(v) {
						literals[v] = at(n)
					}
				case *ast.BinaryExpr:
					// func f(name ...) { ... "vhostmq_" + name ... }
					if v, ok := stringLit(n.X); ok && v == "vhostmq_" && n.Op == token.ADD && fn != nil {
						if id, ok := n.Y.(*ast.Ident); ok {
							if k := slices.Index(params, id.Name); k >= 0 {
								ctors[pkg+"."+fn.Name.Name] = k
							}
						}
					}
				case *ast.CallExpr:
					switch fun := n.Fun.(type) {
					case *ast.Ident:
						cl := call{callee: pkg + "." + fun.Name, params: params, args: n.Args, at: at(n)}
						if fn != nil {
							cl.caller = pkg + "." + fn.Name.Name
						}
						calls = append(calls, cl)
					case *ast.SelectorExpr:
						// prometheus.NewDesc("vhostmq_...", ...)
						if x, ok := fun.X.(*ast.Ident); ok && x.Name == "prometheus" && fun.Sel.Name == "NewDesc" && len(n.Args) > 0 {
							if v, ok := stringLit(n.Args[0]); ok && strings.HasPrefix(v, "vhostmq_") {
								c.metrics[v] = at(n)
							}
						}
					}
				case *ast.CompositeLit:
					// prometheus.CounterOpts{Namespace: "vhostmq", Name: "..."} and the like
					if sel, ok := n.Type.(*ast.SelectorExpr); ok && strings.HasSuffix(sel.Sel.Name, "Opts") {
						if x, ok := sel.X.(*ast.Ident); ok && x.Name == "prometheus" {
							if v := optsName(n); strings.HasPrefix(v, "vhostmq_") {
								c.metrics[v] = at(n)
							}
						}
					}
				}
				return true
			})
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	// a function passing its parameter on to a constructor is one too
	for changed := true; changed; {
		changed = false
		for _, cl := range calls {
			k, ok := ctors[cl.callee]
			if !ok || k >= len(cl.args) || cl.caller == "" {
				continue
			}
			if _, done := ctors[cl.caller]; done {
				continue
			}
			if id, ok := cl.args[k].(*ast.Ident); ok {
				if j := slices.Index(cl.params, id.Name); j >= 0 {
					ctors[cl.caller] = j
					changed = true
				}
			}
		}
	}
	for _, cl := range calls {
		if k, ok := ctors[cl.callee]; ok && k < len(cl.args) {
			if v, ok := stringLit(cl.args[k]); ok {
				c.metrics["vhostmq_"+v] = cl.at
			}
		}
	}
	for v := range literals {
		if _, ok := c.metrics[v]; !ok {
			c.otherNames[v] = true
		}
	}
	return c, nil
}

func stringLit(e ast.Expr) (string, bool) {
	lit, ok := e.(*ast.BasicLit)
	if !ok || lit.Kind != token.STRING {
		return "", false
	}
	v, err := strconv.Unquote(lit.Value)
	return v, err == nil
}

func optsName(cl *ast.CompositeLit) string {
	var parts []string
	for _, field := range []string{"Namespace", "Subsystem", "Name"} {
		for _, e := range cl.Elts {
			kv, ok := e.(*ast.KeyValueExpr)
			if !ok {
				continue
			}
			if k, ok := kv.Key.(*ast.Ident); ok && k.Name == field {
				if v, ok := stringLit(kv.Value); ok && v != "" {
					parts = append(parts, v)
				}
			}
		}
	}
	return strings.Join(parts, "_")
}

// trimName drops what ends a sentence after a name.
func trimName(s string) string { return strings.TrimRight(s, ".-_") }

func (p pos) String() string { return fmt.Sprintf("%s:%d", p.file, p.line) }

// ---- Markdown ----

// mention is a name found in the documentation.
type mention struct {
	name string
	file string
	line int
}

// mentions finds the names re matches (its first group) in the files,
// code blocks included.
func mentions(files []*mdFile, re *regexp.Regexp, group int) []mention {
	var out []mention
	for _, f := range files {
		for i, l := range f.lines {
			for _, m := range re.FindAllStringSubmatch(l, -1) {
				out = append(out, mention{m[group], f.path, i + 1})
			}
		}
	}
	return out
}

var fence = regexp.MustCompile("^ {0,3}(`{3,}|~{3,})")

// prose calls fn with each line of lines outside fenced code blocks and
// HTML comments, code spans blanked.
func prose(lines []string, fn func(n int, line string)) {
	inFence, inComment := "", false
	for i, l := range lines {
		if inFence != "" {
			if m := fence.FindStringSubmatch(l); m != nil && m[1][0] == inFence[0] && len(m[1]) >= len(inFence) && strings.TrimSpace(l[len(m[0]):]) == "" {
				inFence = ""
			}
			continue
		}
		if m := fence.FindStringSubmatch(l); m != nil && !inComment {
			inFence = m[1]
			continue
		}
		l = blankCodeSpans(l)
		// HTML comments
		var kept strings.Builder
		for l != "" {
			if inComment {
				end := strings.Index(l, "-->")
				if end < 0 {
					l = ""
					break
				}
				l, inComment = l[end+3:], false
				continue
			}
			start := strings.Index(l, "<!--")
			if start < 0 {
				kept.WriteString(l)
				break
			}
			kept.WriteString(l[:start])
			l, inComment = l[start+4:], true
		}
		fn(i+1, kept.String())
	}
}

// blankCodeSpans replaces the text of each code span of l with spaces.
func blankCodeSpans(l string) string {
	b := []byte(l)
	for i := 0; i < len(b); {
		if b[i] != '`' {
			i++
			continue
		}
		n := 0
		for i+n < len(b) && b[i+n] == '`' {
			n++
		}
		closing := -1
		for j := i + n; j < len(b); {
			if b[j] != '`' {
				j++
				continue
			}
			m := 0
			for j+m < len(b) && b[j+m] == '`' {
				m++
			}
			if m == n {
				closing = j
				break
			}
			j += m
		}
		if closing < 0 {
			i += n
			continue
		}
		for k := i; k < closing+n; k++ {
			b[k] = ' '
		}
		i = closing + n
	}
	return string(b)
}

// ---- (a) annotations ----

func TestAnnotationsDocumented(t *testing.T) {
	r := load(t)
	if len(r.code.annotations) == 0 {
		t.Fatal("no Annotation* constant holding a vhostmq.io/ or kubernetes.io/*-bandwidth key found in the code: has the naming changed? (hack/docscheck)")
	}
	var fails failures
	// a vhostmq.io/ key the code spells that is not an Annotation* constant
	for v, ps := range r.code.keyLiterals {
		if _, ok := r.code.annotations[v]; ok {
			continue
		}
		if _, ok := nonAnnotations[v]; ok {
			continue
		}
		for _, p := range ps {
			fails.add(p.file, p.line, "%q: a vhostmq.io/ name that is no Annotation* constant: make it one (an annotation) or add it to nonAnnotations in hack/docscheck", v)
		}
	}
	documented := map[string]bool{}
	for _, m := range append(mentions(r.documented, vhostmqName, 1), mentions(r.documented, bandwidthName, 1)...) {
		documented[trimName(m.name)] = true
	}
	for key, ps := range r.code.annotations {
		if !documented[key] {
			fails.add(ps[0].file, ps[0].line, "annotation %s is not documented in %s or %s/", key, strings.Join(documentedIn, ", "), docsDir)
		}
	}
	for _, m := range append(mentions(r.checked, vhostmqName, 1), mentions(r.checked, bandwidthName, 1)...) {
		name := trimName(m.name)
		if _, ok := r.code.annotations[name]; ok || r.code.names[name] {
			continue
		}
		fails.add(m.file, m.line, "%s: no such annotation (or other name) in the code%s", name, closest(name, keys(r.code.annotations)))
	}
	fails.report(t, "annotation mismatches between the code and the documentation")
}

// ---- (b) metrics ----

var metricMention = regexp.MustCompile(`(?:^|[^A-Za-z0-9_])(vhostmq_[A-Za-z0-9_]*)(\*?)`)

func TestMetricsDocumented(t *testing.T) {
	r := load(t)
	if len(r.code.metrics) == 0 {
		t.Fatal(`no vhostmq_ metric found in the code: has the way metrics are declared changed? (hack/docscheck finds functions that prepend "vhostmq_" to a parameter, prometheus.NewDesc and prometheus.*Opts)`)
	}
	var fails failures
	// where each metric must be documented
	where := r.documented
	whereName := strings.Join(documentedIn, ", ") + " or " + docsDir + "/"
	if i := slices.IndexFunc(r.documented, func(f *mdFile) bool { return f.path == metricsReference }); i >= 0 {
		where, whereName = r.documented[i:i+1], metricsReference
	} else {
		t.Logf("%s does not exist yet: each metric may be documented anywhere in %s", metricsReference, whereName)
	}
	documented := map[string]bool{}
	for _, m := range mentions(where, metricMention, 1) {
		documented[m.name] = true
	}
	for name, p := range r.code.metrics {
		if !documented[name] {
			fails.add(p.file, p.line, "metric %s is not documented in %s", name, whereName)
		}
	}
	names := keys(r.code.metrics)
	for _, f := range r.checked {
		for i, l := range f.lines {
			for _, m := range metricMention.FindAllStringSubmatch(l, -1) {
				name, star := m[1], m[2] == "*"
				if star || strings.HasSuffix(name, "_") {
					if !slices.ContainsFunc(names, func(n string) bool { return strings.HasPrefix(n, name) }) {
						fails.add(f.path, i+1, "%s%s: no metric in the code starts with %s", name, m[2], name)
					}
					continue
				}
				if _, ok := r.code.metrics[name]; ok || r.code.otherNames[name] {
					continue
				}
				// a histogram's or summary's series
				if slices.ContainsFunc([]string{"_bucket", "_sum", "_count"}, func(suffix string) bool {
					_, ok := r.code.metrics[strings.TrimSuffix(name, suffix)]
					return strings.HasSuffix(name, suffix) && ok
				}) {
					continue
				}
				fails.add(f.path, i+1, "%s: no such metric in the code%s", name, closest(name, names))
			}
		}
	}
	fails.report(t, "metric mismatches between the code and the documentation")
}

// ---- (c) links ----

var (
	inlineLink = regexp.MustCompile(`\]\(\s*(<[^>]*>|[^\s()]*(?:\([^\s()]*\)[^\s()]*)*)(?:\s+(?:"[^"]*"|'[^']*'))?\s*\)`)
	refLink    = regexp.MustCompile(`^ {0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)`)
	htmlLink   = regexp.MustCompile(`(?i)<(?:a|img)\s[^>]*?(?:href|src)\s*=\s*"([^"]*)"`)
	scheme     = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9+.-]*:`)
	lineAnchor = regexp.MustCompile(`^L[0-9]+(-L[0-9]+)?$`)
)

func TestLinksResolve(t *testing.T) {
	r := load(t)
	var fails failures
	anchors := map[string]map[string]bool{} // by target file, from the root
	anchorsOf := func(rel string) (map[string]bool, error) {
		if a, ok := anchors[rel]; ok {
			return a, nil
		}
		f, err := readMarkdown(r.root, rel)
		if err != nil {
			return nil, err
		}
		a := headingAnchors(f.lines)
		anchors[rel] = a
		return a, nil
	}
	for _, p := range r.missing {
		fails.add(p, 0, "does not exist (hack/docscheck lists it: remove it there if it is gone for good)")
	}
	links := 0
	for _, f := range r.checked {
		prose(f.lines, func(n int, line string) {
			var targets []string
			for _, re := range []*regexp.Regexp{inlineLink, refLink, htmlLink} {
				for _, m := range re.FindAllStringSubmatch(line, -1) {
					targets = append(targets, strings.TrimSuffix(strings.TrimPrefix(m[1], "<"), ">"))
				}
			}
			for _, target := range targets {
				if target == "" || scheme.MatchString(target) || strings.HasPrefix(target, "//") {
					continue
				}
				links++
				if msg := checkLink(r.root, f.path, target, anchorsOf); msg != "" {
					fails.add(f.path, n, "link %s: %s", target, msg)
				}
			}
		})
	}
	if links == 0 {
		t.Error("no relative link found in the documentation: is the link parser broken? (hack/docscheck)")
	}
	fails.report(t, "broken relative links")
}

// checkLink says what is wrong with the relative link target in the
// file from (from the root), or "".
func checkLink(root, from, target string, anchorsOf func(string) (map[string]bool, error)) string {
	p, anchor, hasAnchor := strings.Cut(target, "#")
	p, _, _ = strings.Cut(p, "?")
	p, err := url.PathUnescape(p)
	if err != nil {
		return "bad escape: " + err.Error()
	}
	var rel string
	switch {
	case p == "":
		rel = from
	case strings.HasPrefix(p, "/"):
		rel = path.Clean(strings.TrimPrefix(p, "/"))
	default:
		rel = path.Join(path.Dir(from), p)
	}
	if rel == ".." || strings.HasPrefix(rel, "../") {
		return "points outside the repository"
	}
	st, err := os.Stat(filepath.Join(root, filepath.FromSlash(rel)))
	if err != nil {
		return fmt.Sprintf("%s does not exist", rel)
	}
	if !hasAnchor {
		return ""
	}
	if anchor, err = url.PathUnescape(anchor); err != nil {
		return "bad escape in the anchor: " + err.Error()
	}
	if st.IsDir() {
		// GitHub shows the directory's README.md
		readme := path.Join(rel, "README.md")
		if _, err := os.Stat(filepath.Join(root, filepath.FromSlash(readme))); err != nil {
			return fmt.Sprintf("#%s: %s is a directory without a README.md", anchor, rel)
		}
		rel = readme
	}
	if !strings.EqualFold(path.Ext(rel), ".md") {
		if lineAnchor.MatchString(anchor) {
			return ""
		}
		return fmt.Sprintf("#%s: %s is not Markdown; only line anchors (#L12, #L12-L20) can be checked", anchor, rel)
	}
	a, err := anchorsOf(rel)
	if err != nil {
		return err.Error()
	}
	if a[anchor] {
		return ""
	}
	if a[strings.ToLower(anchor)] {
		return fmt.Sprintf("#%s: GitHub's heading anchors are lowercase: #%s", anchor, strings.ToLower(anchor))
	}
	return fmt.Sprintf("no heading of %s has the anchor #%s%s", rel, anchor, closest(anchor, keys(a)))
}

var (
	atxHeading = regexp.MustCompile(`^ {0,3}#{1,6}(?:[ \t]+(.*?))?[ \t]*$`)
	atxClosing = regexp.MustCompile(`(?:^|[ \t]+)#+$`)
	setextLine = regexp.MustCompile(`^ {0,3}(=+|-+)[ \t]*$`)
	notPara    = regexp.MustCompile(`^\s*$|^ {0,3}([#>|]|[-*+][ \t]|[0-9]+[.)][ \t])`)
	htmlID     = regexp.MustCompile(`(?i)<[a-z][^>]*\s(?:id|name)\s*=\s*"([^"]+)"`)
	image      = regexp.MustCompile(`!\[([^\]]*)\]\([^)]*\)`)
	mdLink     = regexp.MustCompile(`\[([^\]]*)\](?:\([^)]*\)|\[[^\]]*\])`)
	htmlTag    = regexp.MustCompile(`<[^>]+>`)
	underscore = regexp.MustCompile(`(^|[^A-Za-z0-9_])_{1,3}([^_]+?)_{1,3}($|[^A-Za-z0-9_])`)
)

// headingAnchors are the anchors GitHub gives the headings of a Markdown
// file (and the id and name attributes of its HTML).
func headingAnchors(lines []string) map[string]bool {
	out := map[string]bool{}
	s := newSlugger()
	prev := ""
	inFence := ""
	for _, l := range lines {
		if inFence != "" {
			if m := fence.FindStringSubmatch(l); m != nil && m[1][0] == inFence[0] && len(m[1]) >= len(inFence) {
				inFence = ""
			}
			prev = ""
			continue
		}
		if m := fence.FindStringSubmatch(l); m != nil {
			inFence, prev = m[1], ""
			continue
		}
		for _, m := range htmlID.FindAllStringSubmatch(l, -1) {
			out[m[1]] = true
		}
		if m := atxHeading.FindStringSubmatch(l); m != nil {
			out[s.slug(headingText(atxClosing.ReplaceAllString(m[1], "")))] = true
			prev = ""
			continue
		}
		if setextLine.MatchString(l) && prev != "" {
			out[s.slug(headingText(prev))] = true
			prev = ""
			continue
		}
		if notPara.MatchString(l) {
			prev = ""
		} else {
			prev = l
		}
	}
	return out
}

// headingText is the text GitHub renders for a heading's Markdown.
func headingText(md string) string {
	var b strings.Builder
	code := blankCodeSpans(md)
	// outside code spans: links and images to their text, no HTML, no
	// underscore emphasis; inside: as written, without the backticks
	seg := func(from, to int, isCode bool) {
		t := md[from:to]
		if isCode {
			b.WriteString(strings.Trim(t, "`"))
			return
		}
		t = image.ReplaceAllString(t, "$1")
		t = mdLink.ReplaceAllString(t, "$1")
		t = htmlTag.ReplaceAllString(t, "")
		for u := underscore.ReplaceAllString(t, "$1$2$3"); u != t; u = underscore.ReplaceAllString(t, "$1$2$3") {
			t = u
		}
		b.WriteString(html.UnescapeString(t))
	}
	start, isCode := 0, false
	for i := 0; i < len(md); i++ {
		c := code[i] == ' ' && md[i] != ' '
		if c != isCode {
			seg(start, i, isCode)
			start, isCode = i, c
		}
	}
	seg(start, len(md), isCode)
	return strings.TrimSpace(b.String())
}

// slugger gives GitHub's anchors (github-slugger): lowercase, spaces to
// hyphens, every other character but letters, marks, numbers, hyphens
// and underscores dropped; a repeated one gets -1, -2, ...
type slugger struct{ seen map[string]int }

func newSlugger() *slugger { return &slugger{seen: map[string]int{}} }

func (s *slugger) slug(text string) string {
	base := slug(text)
	out := base
	for {
		if _, dup := s.seen[out]; !dup {
			break
		}
		s.seen[base]++
		out = base + "-" + strconv.Itoa(s.seen[base])
	}
	s.seen[out] = 0
	return out
}

func slug(text string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(text) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsNumber(r) || unicode.IsMark(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// ---- helpers ----

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// closest suggests the candidate nearest to s, if one is near.
func closest(s string, candidates []string) string {
	best, bestD := "", len(s)/3+2
	for _, c := range candidates {
		if d := distance(s, c); d < bestD {
			best, bestD = c, d
		}
	}
	if best == "" {
		return ""
	}
	return " (did you mean " + best + "?)"
}

// distance is the Levenshtein distance of a and b.
func distance(a, b string) int {
	prev := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur := make([]int, len(b)+1)
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev = cur
	}
	return prev[len(b)]
}

// ---- (d) alerts ----

const (
	alertRules = "charts/vhostmq/files/alerts.yaml"
	runbooks   = "docs/operations/monitoring.md"
)

var (
	alertRule    = regexp.MustCompile(`^\s*-\s*alert:\s*(\S+)\s*$`)
	runbookTitle = regexp.MustCompile(`^###\s+(\S+)\s*$`)
)

// TestAlertsHaveRunbooks: every alert the chart ships has a runbook (a
// "### Name" section of the monitoring page), and every runbook names an
// alert the chart ships.
func TestAlertsHaveRunbooks(t *testing.T) {
	r := load(t)
	rules, err := readMarkdown(r.root, alertRules) // lines are lines
	if err != nil {
		t.Fatal(err)
	}
	page, err := readMarkdown(r.root, runbooks)
	if err != nil {
		t.Fatal(err)
	}
	find := func(f *mdFile, re *regexp.Regexp) map[string]int {
		out := map[string]int{}
		for i, l := range f.lines {
			if m := re.FindStringSubmatch(l); m != nil {
				out[m[1]] = i + 1
			}
		}
		return out
	}
	alerts, books := find(rules, alertRule), find(page, runbookTitle)
	if len(alerts) == 0 {
		t.Fatalf("no '- alert:' rule found in %s: has its layout changed?", alertRules)
	}
	var fails failures
	for name, line := range alerts {
		if _, ok := books[name]; !ok {
			fails.add(alertRules, line, "alert %s has no runbook (a '### %s' section in %s)", name, name, runbooks)
		}
	}
	for name, line := range books {
		if _, ok := alerts[name]; !ok {
			fails.add(runbooks, line, "runbook %s: the chart ships no such alert%s", name, closest(name, keys(alerts)))
		}
	}
	fails.report(t, "alerts without runbooks or runbooks without alerts")
}
