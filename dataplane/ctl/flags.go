package ctl

import (
	"errors"
	"fmt"
	"net"
	"sort"
	"strconv"
	"strings"
	"time"
)

// The flag values below are pflag.Values: Type names the value in --help
// where the usage text has no `NAME`.

// enumValue is a string flag limited to a few words.
type enumValue struct {
	p       *string
	allowed []string
}

func (v *enumValue) String() string {
	if v.p == nil {
		return ""
	}
	return *v.p
}

func (v *enumValue) Type() string { return "string" }

func (v *enumValue) Set(s string) error {
	for _, a := range v.allowed {
		if s == a {
			*v.p = s
			return nil
		}
	}
	return fmt.Errorf("must be %s", orList(v.allowed))
}

func orList(words []string) string {
	if len(words) == 1 {
		return words[0]
	}
	return strings.Join(words[:len(words)-1], ", ") + " or " + words[len(words)-1]
}

// uint32Value is a decimal uint32 flag that remembers whether it was set.
type uint32Value struct {
	p   *uint32
	set bool
}

func (v *uint32Value) String() string {
	if v.p == nil {
		return "0"
	}
	return strconv.FormatUint(uint64(*v.p), 10)
}

func (v *uint32Value) Type() string { return "uint32" }

func (v *uint32Value) Set(s string) error {
	n, err := strconv.ParseUint(s, 10, 32)
	if err != nil {
		if errors.Is(err, strconv.ErrRange) {
			return errors.New("out of range")
		}
		return errors.New("not a non-negative integer")
	}
	*v.p, v.set = uint32(n), true
	return nil
}

// modeValue is a file mode flag in octal (0770 or 770).
type modeValue struct{ p *uint32 }

func (v *modeValue) String() string {
	if v.p == nil || *v.p == 0 {
		return ""
	}
	return fmt.Sprintf("%04o", *v.p)
}

func (v *modeValue) Type() string { return "mode" }

func (v *modeValue) Set(s string) error {
	n, err := strconv.ParseUint(strings.TrimPrefix(s, "0o"), 8, 32)
	if err != nil || n > 0o7777 {
		return errors.New("not an octal file mode like 0770")
	}
	*v.p = uint32(n)
	return nil
}

// durationValue is a non-negative duration flag; a bare number is seconds.
type durationValue struct{ p *time.Duration }

func (v *durationValue) String() string {
	if v.p == nil {
		return ""
	}
	return v.p.String()
}

func (v *durationValue) Type() string { return "duration" }

func (v *durationValue) Set(s string) error {
	d, err := time.ParseDuration(s)
	if err != nil {
		f, ferr := strconv.ParseFloat(s, 64)
		if ferr != nil {
			return errors.New("not a duration like 500ms, 2s or 1m")
		}
		d = time.Duration(f * float64(time.Second))
	}
	if d < 0 {
		return errors.New("must not be negative")
	}
	*v.p = d
	return nil
}

// listValue is a comma-separated list flag; repeating it appends.
type listValue struct{ p *[]string }

func (v *listValue) String() string {
	if v.p == nil {
		return ""
	}
	return strings.Join(*v.p, ",")
}

func (v *listValue) Type() string { return "strings" }

func (v *listValue) Set(s string) error {
	for _, e := range strings.Split(s, ",") {
		e = strings.TrimSpace(e)
		if e == "" {
			return errors.New("empty element in comma-separated list")
		}
		*v.p = append(*v.p, e)
	}
	return nil
}

// labelsValue is a repeatable KEY=VALUE flag.
type labelsValue struct{ m map[string]string }

func (v *labelsValue) String() string {
	if v == nil || len(v.m) == 0 {
		return ""
	}
	keys := sortedKeys(v.m)
	for i, k := range keys {
		keys[i] = k + "=" + v.m[k]
	}
	return strings.Join(keys, ",")
}

func (v *labelsValue) Type() string { return "label" }

func (v *labelsValue) Set(s string) error {
	k, val, ok := strings.Cut(s, "=")
	if !ok || k == "" {
		return errors.New("want KEY=VALUE")
	}
	if _, dup := v.m[k]; dup {
		return fmt.Errorf("label %q given twice", k)
	}
	v.m[k] = val
	return nil
}

// macValue is an Ethernet MAC address flag.
type macValue struct{ p *string }

func (v *macValue) String() string {
	if v.p == nil {
		return ""
	}
	return *v.p
}

func (v *macValue) Type() string { return "mac" }

func (v *macValue) Set(s string) error {
	hw, err := net.ParseMAC(s)
	if err != nil || len(hw) != 6 {
		return errors.New("not a MAC address like 52:54:00:12:34:56")
	}
	*v.p = hw.String()
	return nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
