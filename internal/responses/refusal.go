package responses

import "fmt"

// Refusal is a Responses request that cannot be translated for a backend
// that serves only chat completions: the client's error, answered with a
// 400 the way OpenAI words one (param names the field, e.g. "tools[2].type"
// or "input[0].content[1].file_id").
type Refusal struct {
	Param   string
	Message string
}

func (r *Refusal) Error() string {
	if r.Param == "" {
		return r.Message
	}
	return r.Param + ": " + r.Message
}

// refuse returns a *Refusal for param.
func refuse(param, format string, args ...any) *Refusal {
	return &Refusal{Param: param, Message: fmt.Sprintf(format, args...)}
}

// mustBe refuses param for having the wrong type.
func mustBe(param, what string) *Refusal {
	return &Refusal{Param: param, Message: param + " must be " + what}
}

// index names the i-th element of an array field, as OpenAI does.
func index(param string, i int) string { return fmt.Sprintf("%s[%d]", param, i) }
