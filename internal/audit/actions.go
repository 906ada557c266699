package audit

import (
	"fmt"
	"os/user"
	"slices"
	"strings"
)

// Actions are every action recorded, in the order the audit page's filter
// lists them.
var Actions = []string{
	SignIn, SignInFailed, SignOut,
	KeyCreate, KeyUpdate, KeyRevoke, BudgetUpdate, ModelsUpdate,
	PersonDisable, PersonEnable, PersonUpdate,
	TeamCreate, TeamUpdate, TeamMemberAdd, TeamMemberRemove, TeamDelete,
	ShareCreate, ShareRevoke,
	ConfigReload, ConfigRejected,
}

// Known reports whether action is one of Actions.
func Known(action string) bool { return slices.Contains(Actions, action) }

// CLI is the actor of a command run with `moonji …` on the server: "cli",
// and the operating system's user who ran it when known ("cli:alice").
// The command line holds the database directly; nobody signed in.
func CLI() string {
	u, err := user.Current()
	if err != nil || u.Username == "" {
		return "cli"
	}
	return "cli:" + u.Username
}

// Changes lists what a change changed, as an event's Detail: "rpm 0→60;
// budget none→5.00 USD/month". Fields that stayed the same are left out.
type Changes struct{ parts []string }

// Set notes that name went from old to new, when they differ.
func (c *Changes) Set(name, old, new string) {
	if old != new {
		c.parts = append(c.parts, fmt.Sprintf("%s %s→%s", name, old, new))
	}
}

// Note adds a part as it is ("expires never").
func (c *Changes) Note(format string, args ...any) {
	c.parts = append(c.parts, fmt.Sprintf(format, args...))
}

// String is the parts, "; " between them.
func (c *Changes) String() string { return strings.Join(c.parts, "; ") }

// Empty reports whether nothing was noted.
func (c *Changes) Empty() bool { return len(c.parts) == 0 }
