// Command conformance-plugin-go is the Go fixture plugin of `plugin.v1`: the conformance
// tool set on grpc-go.
//
// It is the third implementation of the plugin side of the plugin protocol
// (`plugin-protocol.md`, "RFC 0005: Runtime Tool Plugin Protocol"), next to the Rust one
// (`contract-impl plugin fixture`, on impl/src/plugin/sdk) and the Python one
// (impl/src/plugin/python/conformance_plugin.py). It speaks the launch contract of
// docs/plugin-launch-contract.md exactly as they do, so the same black-box scenarios run
// against every language's plugin:
//
//  1. it reads RUNTIME_PLUGIN_PROTOCOL, RUNTIME_PLUGIN_SOCKET and RUNTIME_PLUGIN_SECRET
//     (then removes the secret from its environment), and refuses to start without them
//     (one line on stderr naming the variable, never the secret; exit status 2);
//  2. it serves plugin.v1.PluginService with grpc-go on the Unix socket (0600), and only
//     then writes the handshake line `plugin.v1 ready` on stdout, which it then points
//     at stderr, so a stray print never contaminates the protocol channel;
//  3. it checks the host's proof (`authorization: Bearer <hex HMAC-SHA256(secret,
//     "plugin.v1 host")>`) on every call before decoding it (gate.go), answers one
//     Initialize with the proof of the secret, and refuses a second one;
//  4. it validates every Execute in the SDK's order and streams bounded progress
//     followed by exactly one result or typed failure; Cancel and a dropped stream
//     cancel a call (service.go);
//  5. it exits at once (status 0) when stdin ends or on SIGTERM, removing its socket,
//     and after a Drain once the calls in flight ended or the drain's timeout passed.
//
// It builds from Debian's packages alone in GOPATH mode (golang-go, grpc-go 1.33, the
// protobuf API v2); the schema's Go code is generated from proto/ at build time
// (ci/setup.sh builds .tools/go/bin/conformance-plugin-go).
//
// Exit status: 0 after the host went away (stdin ended, SIGTERM) or a drain ended; 2 when
// the launch environment is missing or wrong (or the socket cannot be served); 70 when
// the crash tool ran.
package main

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"google.golang.org/grpc"
)

// The wire's constants (impl/src/plugin/wire.rs).
const (
	protocolEnv          = "RUNTIME_PLUGIN_PROTOCOL"
	socketEnv            = "RUNTIME_PLUGIN_SOCKET"
	secretEnv            = "RUNTIME_PLUGIN_SECRET"
	protocol             = "plugin.v1"
	handshakeLine        = "plugin.v1 ready"
	protocolMajor        = 1
	protocolMinor        = 0
	secretHexLen         = 64
	proofDomain          = "plugin.v1 initialize "
	hostDomain           = "plugin.v1 host"
	authMetadata         = "authorization"
	maxPayloadBytes      = 256 * 1024
	maxProgressMessages  = 1000
	maxProgressTextBytes = 1024
	maxConcurrentCalls   = 16
	maxCallIDBytes       = 128
	maxFailureTextBytes  = 4096
	maxMessageBytes      = 512 * 1024
	maxDrainTimeoutMS    = 600000
)

// The SDK's own bounds (impl/src/plugin/sdk/service.rs).
const (
	rememberedCallIDs = 65536
	flushGrace        = 2 * time.Second
)

// Exit statuses (impl/src/plugin/sdk/mod.rs, impl/src/plugin/fixture.rs).
const (
	exitOK      = 0
	exitLaunch  = 2
	crashStatus = 70
)

// The fixture's identity, the same in every language's fixture (but its build name).
const (
	pluginName     = "conformance-fixture"
	toolSetVersion = "1.0.0"
	description    = "The plugin.v1 conformance tool set."
	buildName      = "conformance-plugin-go"
)

func macHex(secret, message string) string {
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write([]byte(message))
	return hex.EncodeToString(mac.Sum(nil))
}

// secretProof is the plugin's proof for `challenge` (InitializeResponse.secret_proof).
func secretProof(secret, challenge string) string { return macHex(secret, proofDomain+challenge) }

// hostProof is the host's proof on every call.
func hostProof(secret string) string { return macHex(secret, hostDomain) }

// isSecretShaped is whether `s` is 64 lowercase hexadecimal characters.
func isSecretShaped(s string) bool {
	if len(s) != secretHexLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')) {
			return false
		}
	}
	return true
}

func launchFailure(format string, args ...interface{}) {
	fmt.Fprintf(os.Stderr, "plugin: "+format+"\n", args...)
	os.Exit(exitLaunch)
}

// readLaunch is (socket, secret) from the environment, or exits 2 naming what is wrong.
func readLaunch() (string, string) {
	if p := os.Getenv(protocolEnv); p != protocol {
		launchFailure("%s is %q; this plugin speaks %s", protocolEnv, p, protocol)
	}
	socket := os.Getenv(socketEnv)
	if socket == "" || !filepath.IsAbs(socket) {
		launchFailure("%s must name an absolute socket path", socketEnv)
	}
	secret := os.Getenv(secretEnv)
	// The secret is read once; no process this plugin starts inherits it.
	_ = os.Unsetenv(secretEnv)
	if !isSecretShaped(secret) {
		launchFailure("%s must hold 64 lowercase hexadecimal characters", secretEnv)
	}
	return socket, secret
}

// removeSocket removes the socket file (only if it still is a socket).
func removeSocket(socket string) {
	if info, err := os.Lstat(socket); err == nil && info.Mode()&os.ModeSocket != 0 {
		_ = os.Remove(socket)
	}
}

// watchStdin exits once the host's end of stdin closes (the host died or dropped us).
func watchStdin(socket string) {
	buf := make([]byte, 256)
	for {
		n, err := os.Stdin.Read(buf)
		if n == 0 || err != nil {
			break
		}
	}
	removeSocket(socket)
	os.Exit(exitOK)
}

func main() {
	socket, secret := readLaunch()
	// A broken stderr pipe fails the write instead of killing the process.
	signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE)

	svc := newService(secret)
	server := grpc.NewServer(
		grpc.MaxRecvMsgSize(maxMessageBytes),
		grpc.MaxSendMsgSize(maxMessageBytes),
		grpc.UnknownServiceHandler(handler(svc, hostProof(secret))),
	)
	// Created 0600 (no window with the umask's mode), then set again for certainty.
	old := syscall.Umask(0o177)
	listener, err := net.Listen("unix", socket)
	syscall.Umask(old)
	if err != nil {
		launchFailure("binding %s: %v", socket, err)
	}
	if err := os.Chmod(socket, 0o600); err != nil {
		launchFailure("%s: %v", socket, err)
	}
	// Stopped by its host (or its supervisor), from before readiness on: the socket goes
	// with it.
	terminate := make(chan os.Signal, 1)
	signal.Notify(terminate, syscall.SIGTERM)
	go func() {
		<-terminate
		removeSocket(socket)
		os.Exit(exitOK)
	}()
	served := make(chan error, 1)
	go func() { served <- server.Serve(listener) }()

	// The handshake line, then stdout points at stderr: nothing else ever reaches it.
	if _, err := os.Stdout.WriteString(handshakeLine + "\n"); err != nil {
		launchFailure("writing the handshake line: %v", err)
	}
	if err := syscall.Dup3(2, 1, 0); err != nil {
		launchFailure("pointing stdout at stderr: %v", err)
	}
	go watchStdin(socket)

	select {
	case <-svc.stop:
	case err := <-served:
		if err != nil {
			fmt.Fprintf(os.Stderr, "plugin: serving %s: %v\n", socket, err)
		}
	}
	// A drain's streams had their terminal messages queued; give them a moment to flush.
	deadline := time.Now().Add(flushGrace)
	for svc.inFlight() > 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	stopped := make(chan struct{})
	go func() {
		server.GracefulStop()
		close(stopped)
	}()
	select {
	case <-stopped:
	case <-time.After(flushGrace):
		server.Stop()
	}
	removeSocket(socket)
	os.Exit(exitOK)
}
