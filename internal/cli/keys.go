package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"
	"time"

	"gorm.io/gorm"

	"moonji/internal/apikey"
	"moonji/internal/audit"
	"moonji/models"
)

func cmdKeys(ctx context.Context, args []string, stdout io.Writer) error {
	if len(args) == 0 {
		return fmt.Errorf("%w: keys needs create, list or revoke", ErrUsage)
	}
	switch args[0] {
	case "create":
		return keysCreate(ctx, args[1:], stdout)
	case "list":
		return keysList(ctx, args[1:], stdout)
	case "revoke":
		return keysRevoke(ctx, args[1:], stdout)
	default:
		return fmt.Errorf("%w: unknown keys command %q", ErrUsage, args[0])
	}
}

func keysCreate(ctx context.Context, args []string, stdout io.Writer) error {
	fs, path := newFlagSet("keys create")
	owner := fs.String("owner", "", "email of the key's owner")
	name := fs.String("name", "", "name of the key")
	expires := fs.String("expires", "", "lifetime, e.g. 720h or 30d (default: no expiry)")
	rpm := fs.Int("rpm", 0, "requests per minute for this key (default: the configured limit)")
	budget := addBudgetFlags(fs)
	list := fs.String("models", "", "the models the key may use, comma-separated (default: all)")
	scope := fs.String("scope", models.ScopeInference, "what the key may call: inference (/v1) or admin (/api/v1/admin; the owner must be an admin)")
	if pos, err := parse(fs, args); err != nil {
		return err
	} else if len(pos) > 0 {
		return fmt.Errorf("%w: keys create takes no arguments", ErrUsage)
	}
	if *owner == "" || *name == "" {
		return fmt.Errorf("%w: keys create needs --owner and --name", ErrUsage)
	}
	var lifetime time.Duration
	if *expires != "" {
		d, err := parseDuration(*expires)
		if err != nil {
			return fmt.Errorf("%w: --expires: %v", ErrUsage, err)
		}
		lifetime = d
	}
	if *rpm < 0 {
		return fmt.Errorf("%w: --rpm must not be negative", ErrUsage)
	}
	if !models.ValidScope(*scope) {
		return fmt.Errorf("%w: --scope must be %s or %s, got %q", ErrUsage, models.ScopeInference, models.ScopeAdmin, *scope)
	}
	limits, err := budget.limits()
	if err != nil {
		return err
	}
	if limits.Models, err = modelsFlag(*path, *list); err != nil {
		return err
	}
	db, err := openFor(*path)
	if err != nil {
		return err
	}
	defer models.Close(db)
	user, err := keyOwner(ctx, db, *owner, *scope)
	if err != nil {
		return err
	}
	secret, key, err := apikey.CreateScoped(ctx, db, user, *scope, *name, lifetime, *rpm, limits)
	if errors.Is(err, apikey.ErrAdminScopeOwner) {
		return fmt.Errorf("--scope admin: %s is not an admin (or is disabled); only an admin's key may have the admin scope "+
			"(make them one with: moonji people add --email %s --admin)", user.Email, user.Email)
	}
	if err != nil {
		return err
	}
	record(ctx, db, audit.KeyCreate, audit.KeyTarget(key.ID, key.Name, user.Email),
		audit.KeyCreated(key.RPM, key.ExpiresAt, key.Budget, key.BudgetPeriod, key.Models, ""))
	// The key alone on one line: scripts capture it with $(…).
	_, err = fmt.Fprintln(stdout, secret)
	return err
}

// keyOwner is the person a new key is for: created when missing for an
// inference key (an operator issues keys to people before they sign in),
// but an admin key's owner must exist already, as an admin.
func keyOwner(ctx context.Context, db *gorm.DB, email, scope string) (*models.User, error) {
	if scope != models.ScopeAdmin {
		return models.EnsureUser(ctx, db, email)
	}
	user, err := models.UserByEmail(ctx, db, email)
	if errors.Is(err, models.ErrNotFound) {
		return nil, fmt.Errorf("--scope admin: there is no person %s; only an admin's key may have the admin scope "+
			"(add them with: moonji people add --email %s --admin)", models.NormalizeEmail(email), models.NormalizeEmail(email))
	}
	return user, err
}

func keysList(ctx context.Context, args []string, stdout io.Writer) error {
	fs, path := newFlagSet("keys list")
	if pos, err := parse(fs, args); err != nil {
		return err
	} else if len(pos) > 0 {
		return fmt.Errorf("%w: keys list takes no arguments", ErrUsage)
	}
	db, err := openFor(*path)
	if err != nil {
		return err
	}
	defer models.Close(db)
	keys, err := models.ListAPIKeys(ctx, db, 0)
	if err != nil {
		return err
	}
	now := time.Now()
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tPREFIX\tNAME\tOWNER\tSCOPE\tSTATUS\tRPM\tBUDGET\tPERIOD\tMODELS\tCREATED\tEXPIRES\tLAST USED")
	for _, k := range keys {
		rpm := "default"
		if k.RPM > 0 {
			rpm = strconv.Itoa(k.RPM)
		}
		fmt.Fprintf(tw, "%d\t%s…\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", k.ID, k.Prefix, k.Name, k.User.Email,
			k.KeyScope(), k.Status(now), rpm, fmtBudget(k.Budget), fmtPeriod(k.BudgetPeriod), fmtModels(k.Models),
			fmtTime(&k.CreatedAt), fmtTime(k.ExpiresAt), fmtTime(k.LastUsedAt))
	}
	return tw.Flush()
}

func fmtTime(t *time.Time) string {
	if t == nil || t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

func keysRevoke(ctx context.Context, args []string, stdout io.Writer) error {
	fs, path := newFlagSet("keys revoke")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return fmt.Errorf("%w: keys revoke needs exactly one key ID", ErrUsage)
	}
	id, err := strconv.ParseUint(pos[0], 10, 64)
	if err != nil {
		return fmt.Errorf("%w: key ID must be a number, got %q", ErrUsage, pos[0])
	}
	db, err := openFor(*path)
	if err != nil {
		return err
	}
	defer models.Close(db)
	if err := models.RevokeAPIKey(ctx, db, uint(id), 0); err != nil {
		if errors.Is(err, models.ErrNotFound) {
			return fmt.Errorf("no key with ID %d", id)
		}
		return err
	}
	target := fmt.Sprintf("key %d", id)
	if k, err := models.APIKeyByID(ctx, db, uint(id)); err == nil {
		target = audit.KeyTarget(k.ID, k.Name, k.User.Email)
	}
	record(ctx, db, audit.KeyRevoke, target, "")
	_, err = fmt.Fprintf(stdout, "revoked key %d\n", id)
	return err
}
