package main

// The conformance tools (docs/plugin-launch-contract.md, "The conformance tools"), with
// the Rust fixture's names, descriptions, schemas (the same JSON text, byte for byte),
// mutating flags and capabilities (impl/src/plugin/fixture.rs).

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"

	pluginv1 "runtimecontract/proto/plugin/v1"
)

// toolError is a typed failure of one call.
type toolError struct {
	code    pluginv1.FailureCode
	message string
}

func (e *toolError) Error() string { return e.message }

var errCancelled = &toolError{pluginv1.FailureCode_FAILURE_CODE_CANCELLED, "the call was cancelled"}

// tool is one conformance tool.
type tool struct {
	name         string
	description  string
	schema       schema
	schemaText   string
	mutating     bool
	capabilities []string
	// run answers the output (JSON text) or a typed failure.
	run func(c *call) (string, *toolError)
}

func intPtr(n int) *int           { return &n }
func floatPtr(x float64) *float64 { return &x }
func noProperties() schema        { return schema{required: []string{}} }
func integerRule(lo, hi float64) schemaRule {
	return schemaRule{kind: "integer", minimum: floatPtr(lo), maximum: floatPtr(hi)}
}

// tools are the conformance tools, in their stable order.
var tools = func() []*tool {
	list := []*tool{
		{
			name:        "echo",
			description: "Answers its text.",
			schema:      schema{required: []string{"text"}, names: []string{"text"}, rules: []schemaRule{{kind: "string"}}},
			run:         runEcho,
		},
		{
			name:        "progress",
			description: "Streams `count` progress messages, then answers the count.",
			schema:      schema{required: []string{"count"}, names: []string{"count"}, rules: []schemaRule{integerRule(0, 1000)}},
			run:         runProgress,
		},
		{
			name:        "slow",
			description: "Reports progress once it runs, then runs until cancelled.",
			schema:      noProperties(),
			run:         runSlow,
		},
		{
			name:        "mutate",
			description: "Applies a change named `key`; with outcome `uncertain` it loses track of whether it did.",
			schema: schema{
				required: []string{"key", "outcome"},
				names:    []string{"key", "outcome"},
				rules: []schemaRule{
					{kind: "string", maxLength: intPtr(64)},
					{kind: "string", enum: []string{"applied", "uncertain"}},
				},
			},
			mutating:     true,
			capabilities: []string{"filesystem.write"},
			run:          runMutate,
		},
		{
			name:        "output",
			description: "Answers `bytes` characters of output.",
			schema:      schema{required: []string{"bytes"}, names: []string{"bytes"}, rules: []schemaRule{integerRule(0, 1048576)}},
			run:         runOutput,
		},
		{
			name:        "crash",
			description: "Exits the process at once without answering.",
			schema:      noProperties(),
			run:         runCrash,
		},
		{
			name:         "spawn_detached",
			description:  "Starts a process in a session of its own and answers its PID.",
			schema:       noProperties(),
			capabilities: []string{"process.spawn"},
			run:          runSpawnDetached,
		},
	}
	for _, t := range list {
		t.schemaText = t.schema.text()
	}
	return list
}()

func findTool(name string) *tool {
	for _, t := range tools {
		if t.name == name {
			return t
		}
	}
	return nil
}

// toolCapabilities are every tool's capabilities, once each, in tool order.
func toolCapabilities() []string {
	var all []string
	for _, t := range tools {
		for _, c := range t.capabilities {
			seen := false
			for _, a := range all {
				seen = seen || a == c
			}
			if !seen {
				all = append(all, c)
			}
		}
	}
	return all
}

func toolDefinitions() []*pluginv1.ToolDefinition {
	defs := make([]*pluginv1.ToolDefinition, len(tools))
	for i, t := range tools {
		defs[i] = &pluginv1.ToolDefinition{
			Name:            t.name,
			Description:     t.description,
			InputSchemaJson: t.schemaText,
			Mutating:        t.mutating,
			Capabilities:    append([]string(nil), t.capabilities...),
		}
	}
	return defs
}

func runEcho(c *call) (string, *toolError) {
	return jsonObjectText(jsonMember{"text", jsonQuote(c.arguments.member("text").str)}), nil
}

func runProgress(c *call) (string, *toolError) {
	count, _ := c.arguments.member("count").asUint()
	for i := uint64(1); i <= count; i++ {
		if err := c.progress(fmt.Sprintf("step %d of %d", i, count)); err != nil {
			return "", &toolError{pluginv1.FailureCode_FAILURE_CODE_TOOL_FAILED, err.Error()}
		}
	}
	return jsonObjectText(jsonMember{"count", strconv.FormatUint(count, 10)}), nil
}

func runSlow(c *call) (string, *toolError) {
	// One report once it runs: the event a host waits for before it cancels.
	_ = c.progress("running")
	<-c.cancelled
	return "", errCancelled
}

func runMutate(c *call) (string, *toolError) {
	switch c.arguments.member("outcome").str {
	case "applied":
		return jsonObjectText(jsonMember{"applied", jsonQuote(c.arguments.member("key").str)}), nil
	case "uncertain":
		return "", &toolError{pluginv1.FailureCode_FAILURE_CODE_UNCERTAIN, "the change was sent but its acknowledgement was lost"}
	}
	return "", &toolError{pluginv1.FailureCode_FAILURE_CODE_INVALID_ARGUMENTS, "outcome is `applied` or `uncertain`"}
}

func runOutput(c *call) (string, *toolError) {
	// At most 1048576 (the schema's maximum).
	n, _ := c.arguments.member("bytes").asUint()
	return jsonObjectText(jsonMember{"data", `"` + strings.Repeat("x", int(n)) + `"`}), nil
}

func runCrash(c *call) (string, *toolError) {
	os.Exit(crashStatus)
	return "", nil
}

func runSpawnDetached(c *call) (string, *toolError) {
	// Never the launch secret: it is gone from the environment, and left out here too.
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, secretEnv+"=") {
			env = append(env, kv)
		}
	}
	cmd := exec.Command("setsid", "sleep", "3600")
	cmd.Env = env
	// Stdin, stdout and stderr are /dev/null (nil).
	if err := cmd.Start(); err != nil {
		return "", &toolError{pluginv1.FailureCode_FAILURE_CODE_TOOL_FAILED, "setsid sleep: " + err.Error()}
	}
	pid := cmd.Process.Pid
	// Reaped in the background, so it never lingers as a zombie of this process.
	go func() { _ = cmd.Wait() }()
	return jsonObjectText(jsonMember{"pid", strconv.Itoa(pid)}), nil
}
