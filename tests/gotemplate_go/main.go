// Renders Ollama TEMPLATEs with Go's own text/template, the way Ollama's server does for a chat
// request, for TrainDeck's tests (tests/gotemplate.py builds and runs it). Written for these
// tests from Ollama's documented behaviour (template/template.go, server/images.go,
// thinking/template.go); it is not Ollama's code.
//
// stdin: a JSON list of cases {template, messages, tools, think, is_think_set, system};
// stdout: a JSON list of {prompt, error, vars, think_open, think_close}.
package main

import (
	"bytes"
	"encoding/json"
	"os"
	"sort"
	"strings"
	"text/template"
	"text/template/parse"
	"time"
)

type call struct {
	ID       string
	Function struct {
		Index     int
		Name      string
		Arguments args
	}
}

// args prints as JSON, as Ollama's template arguments do.
type args map[string]any

func (a args) String() string {
	if a == nil {
		return "{}"
	}
	b, _ := json.Marshal(map[string]any(a))
	return string(b)
}

type message struct {
	Role       string
	Content    string
	Thinking   string
	ToolCalls  []call
	ToolName   string
	ToolCallID string
}

// A tool as Ollama hands it to a template: printed as compact JSON in this field order.
type property struct {
	Type        string `json:"type,omitempty"`
	Description string `json:"description,omitempty"`
}
type tool struct {
	Type     string `json:"type"`
	Function struct {
		Name        string `json:"name"`
		Description string `json:"description"`
		Parameters  struct {
			Type       string              `json:"type"`
			Required   []string            `json:"required,omitempty"`
			Properties map[string]property `json:"properties"`
		} `json:"parameters"`
	} `json:"function"`
}

func (t tool) String() string { b, _ := json.Marshal(t); return string(b) }

type tools []tool

func (t tools) String() string { b, _ := json.Marshal([]tool(t)); return string(b) }

type inMessage struct {
	Role       string `json:"role"`
	Content    string `json:"content"`
	Thinking   string `json:"thinking"`
	ToolCallID string `json:"tool_call_id"`
	ToolCalls  []struct {
		ID       string `json:"id"`
		Function struct {
			Name      string         `json:"name"`
			Arguments map[string]any `json:"arguments"`
		} `json:"function"`
	} `json:"tool_calls"`
}

type inCase struct {
	Template   string      `json:"template"`
	Messages   []inMessage `json:"messages"`
	Tools      []tool      `json:"tools"`
	Think      bool        `json:"think"`
	IsThinkSet bool        `json:"is_think_set"`
	System     string      `json:"system"`
}

type outCase struct {
	Prompt     string   `json:"prompt"`
	Error      string   `json:"error"`
	Vars       []string `json:"vars"`
	ThinkOpen  string   `json:"think_open"`
	ThinkClose string   `json:"think_close"`
}

var funcs = template.FuncMap{
	"json":        func(v any) string { b, _ := json.Marshal(v); return string(b) },
	"currentDate": func(a ...string) string { return time.Now().Format("2006-01-02") },
}

func main() {
	var cases []inCase
	if err := json.NewDecoder(os.Stdin).Decode(&cases); err != nil {
		panic(err)
	}
	out := make([]outCase, len(cases))
	for i, c := range cases {
		out[i] = run(c)
	}
	json.NewEncoder(os.Stdout).Encode(out)
}

func run(c inCase) (o outCase) {
	t, err := template.New("").Option("missingkey=zero").Funcs(funcs).Parse(c.Template)
	if err != nil {
		o.Error = err.Error()
		return
	}
	o.Vars = vars(t.Tree.Root)
	o.ThinkOpen, o.ThinkClose = thinkTags(t.Tree.Root)
	msgs := c.Messages
	if c.System != "" && (len(msgs) == 0 || msgs[0].Role != "system") {
		msgs = append([]inMessage{{Role: "system", Content: c.System}}, msgs...)
	}
	// Ollama's collate: all system texts joined; consecutive messages of a role merged,
	// except tool results.
	var system []string
	var list []*message
	for _, m := range msgs {
		if m.Role == "system" {
			system = append(system, m.Content)
		}
		if n := len(list); n > 0 && list[n-1].Role == m.Role && m.Role != "tool" {
			list[n-1].Content += "\n\n" + m.Content
			continue
		}
		mm := &message{Role: m.Role, Content: m.Content, Thinking: m.Thinking,
			ToolCallID: m.ToolCallID}
		for k, tc := range m.ToolCalls {
			var cl call
			cl.ID = tc.ID
			cl.Function.Index = k
			cl.Function.Name = tc.Function.Name
			cl.Function.Arguments = args(tc.Function.Arguments)
			mm.ToolCalls = append(mm.ToolCalls, cl)
		}
		list = append(list, mm)
	}
	plain := make([]message, len(list))
	for k, m := range list {
		plain[k] = *m
	}
	var ts tools
	if len(c.Tools) > 0 {
		ts = tools(c.Tools)
	}
	var b bytes.Buffer
	err = t.Execute(&b, map[string]any{
		"System": strings.Join(system, "\n\n"), "Messages": plain, "Tools": ts,
		"Response": "", "Think": c.Think, "ThinkLevel": "", "IsThinkSet": c.IsThinkSet,
	})
	if err != nil {
		o.Error = err.Error()
	}
	o.Prompt = b.String()
	return
}

// vars: the lower-cased field and variable names a template uses (Ollama's Template.Vars).
func vars(root parse.Node) []string {
	set := map[string]bool{}
	walk(root, nil, func(n parse.Node, _ []parse.Node) {
		switch x := n.(type) {
		case *parse.FieldNode:
			for _, id := range x.Ident {
				set[strings.ToLower(id)] = true
			}
		case *parse.VariableNode:
			for _, id := range x.Ident {
				set[strings.ToLower(strings.TrimPrefix(id, "$"))] = true
			}
		}
	})
	var out []string
	for k := range set {
		if k != "" {
			out = append(out, k)
		}
	}
	sort.Strings(out)
	return out
}

// thinkTags: the heuristic by which Ollama decides a TEMPLATE can think: a .Thinking field
// inside a range over .Messages; the first and last text of the innermost list holding it
// are the opening and closing tags (the last such field decides).
func thinkTags(root parse.Node) (open, close string) {
	walk(root, nil, func(n parse.Node, above []parse.Node) {
		f, ok := n.(*parse.FieldNode)
		if !ok || len(f.Ident) == 0 || f.Ident[0] != "Thinking" {
			return
		}
		var rng *parse.RangeNode
		for k := len(above) - 1; k >= 0 && rng == nil; k-- {
			rng, _ = above[k].(*parse.RangeNode)
		}
		if rng == nil || !strings.Contains(rng.Pipe.String(), ".Messages") {
			return
		}
		for k := len(above) - 1; k >= 0; k-- {
			if l, ok := above[k].(*parse.ListNode); ok {
				open, close = "", ""
				if t, ok := l.Nodes[0].(*parse.TextNode); ok {
					open = strings.TrimSpace(t.String())
				}
				if t, ok := l.Nodes[len(l.Nodes)-1].(*parse.TextNode); ok {
					close = strings.TrimSpace(t.String())
				}
				return
			}
		}
	})
	return
}

func walk(n parse.Node, above []parse.Node, visit func(parse.Node, []parse.Node)) {
	if n == nil {
		return
	}
	visit(n, above)
	above = append(above, n)
	switch x := n.(type) {
	case *parse.ListNode:
		if x == nil {
			return
		}
		for _, c := range x.Nodes {
			walk(c, above, visit)
		}
	case *parse.IfNode:
		walkBranch(&x.BranchNode, above, visit)
	case *parse.RangeNode:
		walkBranch(&x.BranchNode, above, visit)
	case *parse.WithNode:
		walkBranch(&x.BranchNode, above, visit)
	case *parse.ActionNode:
		walk(x.Pipe, above, visit)
	case *parse.PipeNode:
		if x == nil {
			return
		}
		for _, v := range x.Decl {
			walk(v, above, visit)
		}
		for _, c := range x.Cmds {
			walk(c, above, visit)
		}
	case *parse.CommandNode:
		for _, a := range x.Args {
			walk(a, above, visit)
		}
	case *parse.TemplateNode:
		walk(x.Pipe, above, visit)
	}
}

func walkBranch(b *parse.BranchNode, above []parse.Node, visit func(parse.Node, []parse.Node)) {
	walk(b.Pipe, above, visit)
	if b.List != nil {
		walk(b.List, above, visit)
	}
	if b.ElseList != nil {
		walk(b.ElseList, above, visit)
	}
}
