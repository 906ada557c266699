package attachment

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"gorm.io/gorm"

	"moonji/internal/ratelimit"
	"moonji/models"
)

// Bounds of what one person may upload, beside Limits.
const (
	// UploadsPerMinute bounds a person's uploads.
	UploadsPerMinute = 30
	// MaxUnsent bounds a person's attachments uploaded and not yet sent
	// (a message's worth several times over): with MaxBytes, what one
	// person can park in the database.
	MaxUnsent = 20
	// OrphanAge is how long an attachment waits for its message: an older
	// unsent one is deleted by the sweep, or by its person's next upload.
	OrphanAge = time.Hour
	// sweepEvery is how often Run deletes the orphans.
	sweepEvery = 10 * time.Minute
)

// Options wire a Service.
type Options struct {
	DB     *gorm.DB
	Limits Limits
	// Vision names the models that are sent images (configuration:
	// vision: true on a model).
	Vision map[string]bool
	// VisionOf, when set, tells instead of Vision: for models that a
	// configuration reload may change.
	VisionOf func(model string) bool
	// Limiter counts uploads per minute (nil: not counted).
	Limiter *ratelimit.Limiter
	Log     *slog.Logger
}

// Service stores attachments and serves them to their owner.
type Service struct {
	o Options
}

// New returns a Service.
func New(o Options) *Service {
	o.Limits = o.Limits.WithDefaults()
	if o.Log == nil {
		o.Log = slog.Default()
	}
	return &Service{o: o}
}

// Limits are the service's limits, defaults filled.
func (s *Service) Limits() Limits { return s.o.Limits }

// Vision reports whether model is sent images.
func (s *Service) Vision(model string) bool {
	if s.o.VisionOf != nil {
		return s.o.VisionOf(model)
	}
	return s.o.Vision[model]
}

// LimitError is an upload refused for the person's rate: 429 with
// RetryAfter.
type LimitError struct {
	Message    string
	RetryAfter time.Duration
}

func (e *LimitError) Error() string { return e.Message }

// Upload checks data, uploaded by userID under name (Check), and stores it
// unsent. A refused file is an *Error, an upload past the person's rate or
// unsent maximum a *LimitError.
func (s *Service) Upload(ctx context.Context, userID uint, name string, data []byte) (*models.Attachment, error) {
	f, err := Check(name, data, s.o.Limits)
	if err != nil {
		return nil, err
	}
	if s.o.Limiter != nil {
		d, err := s.o.Limiter.AllowRequest(ctx, "chat:uploads:user:"+strconv.FormatUint(uint64(userID), 10),
			ratelimit.Limit{RequestsPerMinute: UploadsPerMinute})
		if err != nil {
			return nil, fmt.Errorf("count uploads of person %d: %w", userID, err)
		}
		if !d.Allowed {
			return nil, &LimitError{RetryAfter: d.RetryAfter,
				Message: fmt.Sprintf("You uploaded %d files in the last minute, the most allowed: wait a moment.", UploadsPerMinute)}
		}
	}
	sum := sha256.Sum256(data)
	a := &models.Attachment{ID: models.NewAttachmentID(), UserID: userID, Kind: f.Kind, Name: f.Name, MIME: f.MIME,
		Bytes: int64(len(data)), SHA256: hex.EncodeToString(sum[:]), Data: data}
	err = models.CreateAttachmentWithin(ctx, s.o.DB, a, MaxUnsent, time.Now().Add(-OrphanAge))
	if errors.Is(err, models.ErrTooManyUnsent) {
		return nil, &LimitError{RetryAfter: OrphanAge,
			Message: fmt.Sprintf("You have %d files attached and not yet sent, the most allowed: send or remove some first.", MaxUnsent)}
	}
	if err != nil {
		return nil, err
	}
	return a, nil
}

// Open returns attachment id with its bytes if it is userID's
// (models.ErrNotFound otherwise).
func (s *Service) Open(ctx context.Context, userID uint, id string) (*models.Attachment, error) {
	return models.AttachmentOf(ctx, s.o.DB, userID, id)
}

// ClaimError is a send's attachments refused: the API answers 400 naming
// Param.
type ClaimError struct {
	Code, Message, Param string
}

func (e *ClaimError) Error() string { return e.Message }

// Prepare checks the attachments ids a person sends with a message to
// model, before anything is stored: at most MaxPerMessage, no repeat, each
// theirs and unsent, and images only for a model with vision. It returns
// them without their bytes.
func (s *Service) Prepare(ctx context.Context, userID uint, model string, ids []string) ([]models.Attachment, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	if n := s.o.Limits.MaxPerMessage; len(ids) > n {
		return nil, &ClaimError{Code: CodeTooMany, Param: "attachment_ids",
			Message: fmt.Sprintf("A message may carry at most %d attachments; this one has %d.", n, len(ids))}
	}
	seen := map[string]bool{}
	for i, id := range ids {
		if seen[id] {
			return nil, &ClaimError{Code: CodeUnknown, Param: fmt.Sprintf("attachment_ids[%d]", i),
				Message: fmt.Sprintf("Attachment %q is given twice.", id)}
		}
		seen[id] = true
	}
	rows, err := models.UnsentAttachments(ctx, s.o.DB, userID, ids)
	if err != nil {
		return nil, err
	}
	byID := map[string]models.Attachment{}
	for _, a := range rows {
		byID[a.ID] = a
	}
	out := make([]models.Attachment, 0, len(ids))
	for i, id := range ids {
		a, ok := byID[id]
		if !ok {
			return nil, unclaimed(i, id)
		}
		if a.Kind == KindImage && !s.Vision(model) {
			return nil, &ClaimError{Code: CodeNotVision, Param: fmt.Sprintf("attachment_ids[%d]", i),
				Message: fmt.Sprintf("The model %s cannot see images: remove %q, or choose a model that can.", model, a.Name)}
		}
		out = append(out, a)
	}
	return out, nil
}

func unclaimed(i int, id string) *ClaimError {
	return &ClaimError{Code: CodeUnknown, Param: fmt.Sprintf("attachment_ids[%d]", i),
		Message: fmt.Sprintf("Attachment %q is unknown or was sent already: attach the file again.", id)}
}

// Claim makes ids the attachments of message msgID, all or none (see
// models.ClaimAttachments); one claimed meanwhile by another send is a
// *ClaimError naming it.
func (s *Service) Claim(ctx context.Context, userID uint, convID, msgID string, ids []string) error {
	err := models.ClaimAttachments(ctx, s.o.DB, userID, convID, msgID, ids)
	var ue *models.UnclaimedError
	if errors.As(err, &ue) {
		for i, id := range ids {
			if id == ue.ID {
				return unclaimed(i, id)
			}
		}
	}
	return err
}

// Release makes message msgID's attachments unsent again (its send failed).
func (s *Service) Release(ctx context.Context, msgID string) error {
	return models.ReleaseAttachments(ctx, s.o.DB, msgID)
}

// Sweep deletes the attachments never sent within OrphanAge.
func (s *Service) Sweep(ctx context.Context) (int64, error) {
	return models.DeleteOrphanAttachments(ctx, s.o.DB, time.Now().Add(-OrphanAge))
}

// Run sweeps the orphans every few minutes until ctx ends. Every replica
// may run it: a sweep is one DELETE.
func (s *Service) Run(ctx context.Context) {
	t := time.NewTicker(sweepEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if n, err := s.Sweep(ctx); err != nil {
				s.o.Log.Warn("delete unsent attachments", "err", err)
			} else if n > 0 {
				s.o.Log.Info("deleted attachments never sent", "attachments", n)
			}
		}
	}
}
