module github.com/vhostmq/vhostmq

go 1.26.0

require (
	golang.org/x/sys v0.50.0
	sigs.k8s.io/yaml v1.6.0
)

require go.yaml.in/yaml/v2 v2.4.2 // indirect
