package api

// AgentTools are the agent loop's tool names, in the order the model sees
// them. The servers check policy rules against them; agent defines the
// tools (and a test keeps the two lists equal).
var AgentTools = []string{"read_file", "list_files", "search", "edit_file", "write_file", "run_command", "repo_map", "finish"}
