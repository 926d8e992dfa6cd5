package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vhostmq/vhostmq/internal/repo"
)

const regenerate = "go run ./hack/docsgen (or make docs), and commit the result"

// The committed reference is what the generator writes from the chart.
func TestHelmValuesUpToDate(t *testing.T) {
	root, err := repo.Root()
	if err != nil {
		t.Fatal(err)
	}
	want, err := generate(root)
	if err != nil {
		t.Fatalf("generating %s: %v", outFile, err)
	}
	got, err := os.ReadFile(filepath.Join(root, outFile))
	if err != nil {
		t.Fatalf("%v\nregenerate: %s", err, regenerate)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from what %s and %s generate (- committed, + generated):\n%s\nregenerate: %s",
			outFile, schemaFile, valuesFile, lineDiff(string(got), string(want)), regenerate)
	}
}

// A value without a description is refused, naming it.
func TestRefusesUndescribedValue(t *testing.T) {
	schema := `{"type": "object", "properties": {
		"a": {"type": "object", "description": "A", "properties": {"b": {"type": "integer"}}},
		"c": {"type": "string"}}}`
	_, err := render([]byte(schema), []byte("a: {b: 1}\nc: x\n"))
	if err == nil || !strings.Contains(err.Error(), "a.b: no description") || !strings.Contains(err.Error(), "c: no description") {
		t.Errorf("render: %v; want a.b and c refused for want of a description", err)
	}
}

func TestRender(t *testing.T) {
	schema := `{"type": "object", "properties": {
		"o": {"type": "object", "description": "an object", "required": ["s"], "properties": {
			"s": {"type": "string", "pattern": "^a|b$", "description": "s <x>"},
			"e": {"enum": ["p", "q"], "description": "e"},
			"l": {"type": "array", "items": {"type": "integer", "minimum": 1}, "description": "l"},
			"m": {"type": "object", "description": "m"}}},
		"n": {"type": "integer", "minimum": 0, "maximum": 9, "description": "n"}}}`
	values := "o:\n  s: a # comment\n  e: q\n  l: [1, 2]\n  m:\n    k: v\nn: 3\n"
	out, err := render([]byte(schema), []byte(values))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"## `o`\n\nan object.\n",
		"| `o.s` | string | `a` | required; matches `^a\\|b$` | s &lt;x> |\n",
		"| `o.e` | string | `q` | `p`, `q` | e |\n",
		"| `o.l` | array of integer | `[1, 2]` | items: ≥ 1 | l |\n",
		"| `o.m` | object | `{k: v}` |  | m |\n",
		"## `n`\n\n| path |",
		"| `n` | integer | `3` | 0..9 | n |\n",
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

// lineDiff is a line diff of a and b: changed lines with two lines of
// context, - for a's, + for b's.
func lineDiff(a, b string) string {
	x, y := strings.Split(a, "\n"), strings.Split(b, "\n")
	if len(x)*len(y) > 16<<20 {
		for i := range min(len(x), len(y)) {
			if x[i] != y[i] {
				return fmt.Sprintf("line %d:\n-%s\n+%s\n(files too large to diff)", i+1, x[i], y[i])
			}
		}
		return "(they differ in length)"
	}
	// lcs[i][j]: the longest common subsequence of x[i:] and y[j:]
	lcs := make([][]int, len(x)+1)
	for i := range lcs {
		lcs[i] = make([]int, len(y)+1)
	}
	for i := len(x) - 1; i >= 0; i-- {
		for j := len(y) - 1; j >= 0; j-- {
			if x[i] == y[j] {
				lcs[i][j] = lcs[i+1][j+1] + 1
			} else {
				lcs[i][j] = max(lcs[i+1][j], lcs[i][j+1])
			}
		}
	}
	type line struct {
		op   byte
		text string
		n    int // line number in a (in b for +)
	}
	var ops []line
	i, j := 0, 0
	for i < len(x) || j < len(y) {
		switch {
		case i < len(x) && j < len(y) && x[i] == y[j]:
			ops = append(ops, line{' ', x[i], i + 1})
			i, j = i+1, j+1
		case i < len(x) && (j == len(y) || lcs[i+1][j] >= lcs[i][j+1]):
			ops = append(ops, line{'-', x[i], i + 1})
			i++
		default:
			ops = append(ops, line{'+', y[j], j + 1})
			j++
		}
	}
	const context = 2
	var out strings.Builder
	last := -1
	for k, o := range ops {
		near := false
		for d := max(0, k-context); d <= min(len(ops)-1, k+context); d++ {
			if ops[d].op != ' ' {
				near = true
				break
			}
		}
		if !near {
			continue
		}
		if last >= 0 && k > last+1 {
			out.WriteString("...\n")
		}
		if last < 0 || k > last+1 {
			fmt.Fprintf(&out, "@@ line %d\n", o.n)
		}
		fmt.Fprintf(&out, "%c%s\n", o.op, o.text)
		last = k
	}
	return out.String()
}

func TestLineDiff(t *testing.T) {
	got := lineDiff("a\nb\nc\nd\ne\nf\ng\nh\n", "a\nb\nc\nD\ne\nf\ng\nh\n")
	want := "@@ line 2\n b\n c\n-d\n+D\n e\n f\n"
	if got != want {
		t.Errorf("lineDiff:\n%s\nwant:\n%s", got, want)
	}
}
