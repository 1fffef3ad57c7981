// Package model is the model gateway of the agent loop: one request and
// response shape for every provider, the providers' wire protocols
// (anthropic: the Messages API; openai: Chat Completions, for any
// OpenAI-compatible server through a base URL; scripted: a JSONL file of
// assistant turns, for the demo, tests and evaluation, no model at all),
// retries with backoff and jitter that honour retry-after, a node-wide
// tokens-per-minute limiter per provider, and the price table that turns
// usage into cost.
//
// The providers are thin HTTP clients written here rather than the
// vendors' SDKs: the gateway keeps each raw response for the event log
// (replay answers from it, never calling twice), places cache_control
// itself, and owns retries and rate limits, which the SDKs do inside.
//
// Credentials come from the node's config or environment, are sent only in
// request headers, and appear in no error, log line or event.
//
// model imports only actor (for its Clock).
package model
