package podnet

import "testing"

func TestParseNetworks(t *testing.T) {
	for s, want := range map[string]string{
		"a":           "ns/a@",
		"x/a@net1, b": "x/a@net1 ns/b@",
		`[{"name":"a","interface":"pod1"},{"name":"b","namespace":"y"}]`: "ns/a@pod1 y/b@",
		"": "",
	} {
		refs, err := ParseNetworks(s, "ns")
		if err != nil {
			t.Errorf("%q: %v", s, err)
			continue
		}
		got := ""
		for i, r := range refs {
			if i > 0 {
				got += " "
			}
			got += r.Namespace + "/" + r.Name + "@" + r.Interface
		}
		if got != want {
			t.Errorf("%q: %q, want %q", s, got, want)
		}
	}
	for _, s := range []string{`[{"name":`, `[{"namespace":"x"}]`, "x/@eth1"} {
		if _, err := ParseNetworks(s, "ns"); err == nil {
			t.Errorf("%q accepted", s)
		}
	}
}

func FuzzParseNetworks(f *testing.F) {
	f.Add("vhu-net,ns/x@eth1")
	f.Add(`[{"name":"a","namespace":"b","interface":"c"}]`)
	f.Fuzz(func(t *testing.T, s string) {
		refs, err := ParseNetworks(s, "pod-ns")
		if err != nil {
			return
		}
		for _, r := range refs {
			if r.Name == "" || r.Namespace == "" {
				t.Fatalf("accepted %q as %+v", s, refs)
			}
		}
	})
}
