package docscheck

import (
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
)

// The checks' own parsing, on inputs whose answer is known.

func TestSlug(t *testing.T) {
	for in, want := range map[string]string{
		"Queue pairs through DRA": "queue-pairs-through-dra",
		"Least exposure: metrics, the CNI's token, the webhook, Pod Security": "least-exposure-metrics-the-cnis-token-the-webhook-pod-security",
		"vhostmq — run":       "vhostmq--run",
		"Foo_bar (baz) 1.2":   "foo_bar-baz-12",
		"C++ & Go":            "c--go",
		"Café über":           "café-über",
		"`dataplane.cpus`":    "dataplanecpus",
		"A [link](x.md) here": "a-link-here",
	} {
		if got := slug(headingText(in)); got != want {
			t.Errorf("slug(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestHeadingText(t *testing.T) {
	for in, want := range map[string]string{
		"`vhostmq_queue_drops_total` and _emphasis_": "vhostmq_queue_drops_total and emphasis",
		"![logo](x.png) Title <sup>beta</sup>":       "logo Title beta",
		"Tom &amp; Jerry":                            "Tom & Jerry",
		"`a b` c":                                    "a b c",
		"snake_case_name":                            "snake_case_name",
	} {
		if got := headingText(in); got != want {
			t.Errorf("headingText(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestHeadingAnchors(t *testing.T) {
	md := strings.Split(`# Title #
## Usage
## Usage
## Usage-1
## Usage
`+"```"+`
# not a heading
`+"```"+`
Setext heading
--------------
- a list item
---
<a name="custom"></a>
#hashtag is no heading
`, "\n")
	got := headingAnchors(md)
	want := map[string]bool{"title": true, "usage": true, "usage-1": true, "usage-1-1": true, "usage-2": true,
		"setext-heading": true, "custom": true}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("headingAnchors = %v, want %v", keys(got), keys(want))
	}
}

func TestCheckLink(t *testing.T) {
	root := t.TempDir()
	for p, text := range map[string]string{
		"README.md":          "# Top\n## Install it\n",
		"docs/a.md":          "# A\n## Part one\n",
		"docs/sub/b.md":      "text\n",
		"docs/dir/README.md": "# Dir\n",
		"main.go":            "package main\n",
	} {
		f := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(f), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(f, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	anchorsOf := func(rel string) (map[string]bool, error) {
		f, err := readMarkdown(root, rel)
		if err != nil {
			return nil, err
		}
		return headingAnchors(f.lines), nil
	}
	for target, want := range map[string]string{
		"a.md":                    "",
		"a.md#part-one":           "",
		"#a":                      "",
		"sub/b.md":                "",
		"../README.md#install-it": "",
		"/README.md#top":          "",
		"dir#dir":                 "",
		"dir/":                    "",
		"../main.go#L3":           "",
		"../main.go":              "",
		"a.md#Part-one":           "lowercase",
		"a.md#part-two":           "no heading of docs/a.md has the anchor #part-two (did you mean part-one?)",
		"c.md":                    "docs/c.md does not exist",
		"../../x.md":              "outside the repository",
		"../main.go#main":         "not Markdown",
		"sub#x":                   "directory without a README.md",
	} {
		got := checkLink(root, "docs/a.md", target, anchorsOf)
		if (want == "") != (got == "") || !strings.Contains(got, want) {
			t.Errorf("checkLink(docs/a.md, %q) = %q, want %q", target, got, want)
		}
	}
}

func TestProseSkipsCode(t *testing.T) {
	md := strings.Split("a [x](one.md) `[y](two.md)`\n```\n[z](three.md)\n```\n<!-- [c](four.md)\n[d](five.md) -->[e](six.md)\n[r]: seven.md", "\n")
	var got []string
	prose(md, func(n int, line string) {
		for _, re := range []*regexp.Regexp{inlineLink, refLink} {
			for _, m := range re.FindAllStringSubmatch(line, -1) {
				got = append(got, m[1])
			}
		}
	})
	if want := []string{"one.md", "six.md", "seven.md"}; !reflect.DeepEqual(got, want) {
		t.Errorf("links found: %v, want %v", got, want)
	}
}

func TestMentions(t *testing.T) {
	f := &mdFile{path: "x.md", lines: []string{
		"Set `vhostmq.io/queues: \"4\"`; queues.vhostmq.io/numaNode is not one, nor https://vhostmq.io/x; see vhostmq.io/polling.",
		"`vhostmq_queue_drops_total{reason=\"x\"}`, vhostmq_uplink_* and my_vhostmq_x.",
	}}
	var names []string
	for _, m := range mentions([]*mdFile{f}, vhostmqName, 1) {
		names = append(names, trimName(m.name))
	}
	if want := []string{"vhostmq.io/queues", "vhostmq.io/polling"}; !reflect.DeepEqual(names, want) {
		t.Errorf("annotation mentions %v, want %v", names, want)
	}
	names = nil
	for _, m := range mentions([]*mdFile{f}, metricMention, 1) {
		names = append(names, m.name)
	}
	if want := []string{"vhostmq_queue_drops_total", "vhostmq_uplink_"}; !reflect.DeepEqual(names, want) {
		t.Errorf("metric mentions %v, want %v", names, want)
	}
}
