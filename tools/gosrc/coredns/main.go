// CoreDNS with only the plugins a cluster DNS needs, built the way CoreDNS documents for
// external builds: import the plugins and set the directive order, then run coremain.
// Upstream's main (github.com/coredns/coredns) links every plugin (cloud SDKs included),
// which costs minutes of build time on a 2-core machine and gives the node tier nothing.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/hosts"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/loop"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/reload"
	_ "github.com/coredns/coredns/plugin/template"
)

// The same relative order as upstream's core/dnsserver/zdirectives.go (order decides which
// plugin sees a request first).
var directives = []string{
	"reload", "bind", "ready", "health", "errors", "log", "loadbalance",
	"cache", "template", "hosts", "kubernetes", "loop", "forward",
}

func init() { dnsserver.Directives = directives }

func main() { coremain.Run() }
