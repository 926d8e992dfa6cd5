// Package config reads and validates the dataplane daemon's YAML
// configuration. Every error names the field, the value and what is
// allowed.
package config

import (
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/vhostmq/vhostmq/dataplane/netdev"
)

// Config is the daemon's configuration file.
type Config struct {
	// CPUs the workers run on, one worker per CPU; default: every CPU the
	// process may run on.
	CPUs []int `json:"cpus,omitempty"`
	// StatsFile, when set, receives a JSON snapshot of every counter every
	// 500 ms and at exit.
	StatsFile string `json:"statsFile,omitempty"`
	// LogLevel is debug, info, warn or error.
	LogLevel string `json:"logLevel,omitempty"`
	// MACAgeSeconds is how long a learned MAC address lives without
	// traffic; default 300.
	MACAgeSeconds int    `json:"macAgeSeconds,omitempty"`
	Ports         []Port `json:"ports,omitempty"`
}

// Port is one vhost-user port.
type Port struct {
	Name       string `json:"name"`
	Socket     string `json:"socket"`
	Role       string `json:"role"`
	QueuePairs int    `json:"queuePairs"`
	MTU        int    `json:"mtu,omitempty"`
	MAC        string `json:"mac,omitempty"`
}

// Load reads and validates a config file.
func Load(path string) (*Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return Parse(b)
}

// Parse decodes and validates YAML; unknown fields are errors.
func Parse(b []byte) (*Config, error) {
	var c Config
	if err := yaml.UnmarshalStrict(b, &c); err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	return &c, nil
}

// Validate checks the whole config and reports every problem it finds.
func (c *Config) Validate() error {
	var errs []error
	ncpu := runtime.NumCPU()
	seen := map[int]bool{}
	for i, cpu := range c.CPUs {
		if cpu < 0 || cpu >= ncpu {
			errs = append(errs, fmt.Errorf("cpus[%d]: CPU %d does not exist (this machine has CPUs 0..%d)", i, cpu, ncpu-1))
		}
		if seen[cpu] {
			errs = append(errs, fmt.Errorf("cpus[%d]: CPU %d is listed twice", i, cpu))
		}
		seen[cpu] = true
	}
	switch strings.ToLower(c.LogLevel) {
	case "", "debug", "info", "warn", "error":
	default:
		errs = append(errs, fmt.Errorf("logLevel: %q is not debug, info, warn or error", c.LogLevel))
	}
	if c.MACAgeSeconds < 0 {
		errs = append(errs, fmt.Errorf("macAgeSeconds: %d must not be negative", c.MACAgeSeconds))
	}
	names, sockets := map[string]bool{}, map[string]bool{}
	for i := range c.Ports {
		p := &c.Ports[i]
		nc, err := p.NetdevConfig()
		if err != nil {
			errs = append(errs, fmt.Errorf("ports[%d]: %w", i, err))
			continue
		}
		if err := nc.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("ports[%d]: %w", i, err))
		}
		if names[p.Name] {
			errs = append(errs, fmt.Errorf("ports[%d]: name: %q is used twice", i, p.Name))
		}
		if sockets[p.Socket] {
			errs = append(errs, fmt.Errorf("ports[%d]: socket: %q is used twice", i, p.Socket))
		}
		names[p.Name], sockets[p.Socket] = true, true
	}
	return errors.Join(errs...)
}

// NetdevConfig converts a port entry, applying defaults (MTU 1500).
func (p *Port) NetdevConfig() (netdev.Config, error) {
	nc := netdev.Config{Name: p.Name, Socket: p.Socket, Role: netdev.Role(p.Role), QueuePairs: p.QueuePairs, MTU: p.MTU}
	if nc.MTU == 0 {
		nc.MTU = 1500
	}
	if p.MAC != "" {
		mac, err := net.ParseMAC(p.MAC)
		if err != nil || len(mac) != 6 {
			return nc, fmt.Errorf("mac: %q is not an Ethernet address like 52:54:00:12:34:56", p.MAC)
		}
		nc.MAC = mac
	}
	return nc, nil
}
