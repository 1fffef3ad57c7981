// Package agent is what a task actor runs: the agent loop, its tools, the
// context it builds, policy, budgets and replay. The model gateway is
// agent/model.
//
// The tools act on the task's sandbox through the Sandbox interface (the
// node adapts its driver's sandbox to it); agent never imports a concrete
// driver.
package agent
