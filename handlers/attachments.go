package handlers

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/gofiber/fiber/v2"

	"moonji/internal/attachment"
	"moonji/internal/chat"
	"moonji/models"
	"moonji/views"
)

// multipartOverhead is what an upload may carry beyond its file: the
// multipart framing, the part's headers, a few small fields.
const multipartOverhead = 64 << 10

// attachmentJSON is an attachment in the API.
type attachmentJSON struct {
	ID    string `json:"id"`
	Kind  string `json:"kind"`
	Name  string `json:"name"`
	Bytes int64  `json:"bytes"`
	MIME  string `json:"mime"`
}

// UploadAttachment serves POST /api/v1/attachments (multipart/form-data,
// the file in field "file"): 201 {id, kind, name, bytes}, the file stored
// unsent until a message claims it. It is mounted before the server's
// small-body bound and reads its body itself: refused from its
// Content-Length when larger than a file may be, then streamed through the
// multipart reader within that bound (a chunked body is cut as soon as it
// passes it). It authenticates itself (session and CSRF header), before
// reading a byte of the body.
func (h *Handler) UploadAttachment(c *fiber.Ctx) error {
	const invalid = "invalid_request_error"
	p, ok := h.person(c)
	if !ok {
		SkipBody(c)
		return apiError(c, http.StatusUnauthorized, "Sign in first: uploads take a login session and its "+
			"X-CSRF-Token header.", invalid, "unauthorized")
	}
	if h.Attachments == nil {
		SkipBody(c)
		return apiError(c, http.StatusNotFound, "Attachments are not enabled.", invalid, "not_found")
	}
	lim := h.Attachments.Limits()
	fileLimit := lim.UploadLimit()
	bound := fileLimit + multipartOverhead
	tooLarge := func() error {
		SkipBody(c)
		return apiErrorParam(c, http.StatusRequestEntityTooLarge, fmt.Sprintf("The file is too large: an image may be at most %s, a text file %s.",
			attachment.Size(lim.MaxBytes), attachment.Size(lim.TextLimit())), invalid, attachment.CodeTooLarge, "file")
	}
	if int64(c.Request().Header.ContentLength()) > bound {
		return tooLarge()
	}
	mt, params, err := mime.ParseMediaType(c.Get(fiber.HeaderContentType))
	if err != nil || mt != "multipart/form-data" || params["boundary"] == "" {
		SkipBody(c)
		return apiError(c, http.StatusBadRequest, "Send the file as multipart/form-data, in the field \"file\".", invalid, "invalid_request")
	}
	var body io.Reader = c.Context().RequestBodyStream()
	if body == nil {
		body = bytes.NewReader(c.Request().Body())
	}
	lr := &io.LimitedReader{R: body, N: bound + 1}
	name, data, err := readUpload(multipart.NewReader(lr, params["boundary"]), fileLimit)
	if err == nil {
		_, err = io.Copy(io.Discard, lr) // the epilogue, within the bound
	}
	switch {
	case lr.N <= 0 || errors.Is(err, errFileTooLarge):
		return tooLarge()
	case err != nil:
		SkipBody(c)
		var be *bodyError
		if errors.As(err, &be) {
			return apiErrorParam(c, http.StatusBadRequest, be.Message, invalid, "invalid_request", be.Param)
		}
		return apiError(c, http.StatusBadRequest, "The upload could not be read: "+err.Error(), invalid, "invalid_request")
	}
	a, err := h.Attachments.Upload(c.UserContext(), p.UserID, name, data)
	if err != nil {
		return h.attachmentError(c, err)
	}
	return c.Status(http.StatusCreated).JSON(attachmentJSON{ID: a.ID, Kind: a.Kind, Name: a.Name, Bytes: a.Bytes, MIME: a.MIME})
}

var errFileTooLarge = errors.New("file too large")

// readUpload reads the multipart body's one "file" part — its name as the
// client gave it (Content-Disposition's filename, not reduced to a base
// name, so that a name with a path is refused rather than cut) and at most
// limit bytes of it — skipping other fields.
func readUpload(mr *multipart.Reader, limit int64) (string, []byte, error) {
	var name string
	var data []byte
	found := false
	for {
		part, err := mr.NextPart()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return "", nil, err
		}
		if part.FormName() != "file" {
			if _, err := io.Copy(io.Discard, part); err != nil {
				return "", nil, err
			}
			continue
		}
		if found {
			return "", nil, &bodyError{Message: "Send one file per upload.", Param: "file"}
		}
		found = true
		_, params, err := mime.ParseMediaType(part.Header.Get("Content-Disposition"))
		if err != nil {
			return "", nil, &bodyError{Message: "The file's name could not be read: " + err.Error(), Param: "file"}
		}
		name = params["filename"]
		if data, err = io.ReadAll(io.LimitReader(part, limit+1)); err != nil {
			return "", nil, err
		}
		if int64(len(data)) > limit {
			return "", nil, errFileTooLarge
		}
	}
	if !found {
		return "", nil, &bodyError{Message: "No file: send it in the multipart field \"file\".", Param: "file"}
	}
	return name, data, nil
}

// attachmentError answers an upload the attachment service refused.
func (h *Handler) attachmentError(c *fiber.Ctx, err error) error {
	const invalid = "invalid_request_error"
	var ae *attachment.Error
	var le *attachment.LimitError
	switch {
	case errors.As(err, &ae):
		status := http.StatusBadRequest
		switch ae.Code {
		case attachment.CodeTooLarge:
			status = http.StatusRequestEntityTooLarge
		case attachment.CodeType:
			status = http.StatusUnsupportedMediaType
		}
		return apiErrorParam(c, status, ae.Message, invalid, ae.Code, "file")
	case errors.As(err, &le):
		c.Set(fiber.HeaderRetryAfter, strconv.Itoa(max(1, int(le.RetryAfter.Seconds()))))
		return apiError(c, http.StatusTooManyRequests, le.Message, "requests", attachment.CodeTooManyFresh)
	default:
		h.Log.Error("store attachment", "err", err)
		return apiError(c, http.StatusInternalServerError, "The upload failed.", "server_error", "internal_error")
	}
}

// Attachment serves GET /api/v1/attachments/{id}: the file, to its owner
// only (anyone else: 404). The bytes are served as what they were checked
// to be, never sniffed (nosniff), in a sandbox with no scripts (a file is
// the person's, not the site's), a text file as a download; an id never
// changes its bytes, so the browser keeps it.
func (h *Handler) Attachment(c *fiber.Ctx) error {
	p, ok := h.person(c)
	if !ok {
		return apiError(c, http.StatusUnauthorized, "Sign in first.", "invalid_request_error", "unauthorized")
	}
	if h.Attachments == nil {
		return apiError(c, http.StatusNotFound, "No such attachment.", "invalid_request_error", "not_found")
	}
	a, err := h.Attachments.Open(c.UserContext(), p.UserID, c.Params("id"))
	if errors.Is(err, models.ErrNotFound) {
		return apiError(c, http.StatusNotFound, "No such attachment.", "invalid_request_error", "not_found")
	}
	if err != nil {
		h.Log.Error("read attachment", "err", err)
		return apiError(c, http.StatusInternalServerError, "The file could not be read.", "server_error", "internal_error")
	}
	disposition := "attachment"
	ctype := "text/plain; charset=utf-8"
	if a.Kind == attachment.KindImage {
		disposition, ctype = "inline", a.MIME
	}
	c.Set(fiber.HeaderContentType, ctype)
	c.Set(fiber.HeaderXContentTypeOptions, "nosniff")
	c.Set(fiber.HeaderContentSecurityPolicy, "sandbox; default-src 'none'; img-src 'self'; style-src 'unsafe-inline'")
	c.Set("Cross-Origin-Resource-Policy", "same-origin")
	c.Set(fiber.HeaderContentDisposition, ContentDisposition(disposition, a.Name))
	c.Set(fiber.HeaderCacheControl, "private, max-age=31536000, immutable")
	c.Set(fiber.HeaderETag, `"`+a.SHA256+`"`)
	return c.Send(a.Data)
}

// ContentDisposition names a file for the browser safely: an ASCII
// fallback with anything outside letters, digits and a few marks replaced,
// and the real name percent-encoded (RFC 6266 filename*).
func ContentDisposition(disposition, name string) string {
	var ascii strings.Builder
	for _, r := range name {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', strings.ContainsRune(" ._-()[]+,", r):
			ascii.WriteRune(r)
		default:
			ascii.WriteByte('_')
		}
	}
	fallback := strings.TrimSpace(ascii.String())
	if fallback == "" {
		fallback = "file"
	}
	return disposition + `; filename="` + fallback + `"; filename*=UTF-8''` + strings.ReplaceAll(url.QueryEscape(name), "+", "%20")
}

// attachmentRefusal answers a send refused for its attachments: 400 naming
// the attachment at fault (attachment_ids[1]) or the list. ok is false for
// any other error.
func attachmentRefusal(c *fiber.Ctx, err error) (error, bool) {
	var ce *attachment.ClaimError
	switch {
	case errors.As(err, &ce):
		return apiErrorParam(c, http.StatusBadRequest, ce.Message, "invalid_request_error", ce.Code, ce.Param), true
	case errors.Is(err, chat.ErrNoAttachments):
		return apiErrorParam(c, http.StatusBadRequest, "Attachments are not enabled.", "invalid_request_error", "invalid_request", "attachment_ids"), true
	}
	return nil, false
}

// attachmentProblem words a send refused for its attachments for the
// composer, or the form's attachment fields refused.
func attachmentProblem(err error) (string, bool) {
	var ce *attachment.ClaimError
	var be *bodyError
	switch {
	case errors.As(err, &ce):
		return ce.Message, true
	case errors.As(err, &be):
		return be.Message, true
	case errors.Is(err, chat.ErrNoAttachments):
		return "Attachments are not enabled.", true
	}
	return "", false
}

// attachOptions configures the composer's Attach control for the models
// the person may use.
func (h *Handler) attachOptions(allowed []string) views.AttachOptions {
	if h.Attachments == nil {
		return views.AttachOptions{}
	}
	lim := h.Attachments.Limits()
	o := views.AttachOptions{MaxBytes: lim.MaxBytes, MaxTextBytes: lim.TextLimit(), MaxFiles: lim.MaxPerMessage,
		Accept: attachment.Accept(true)}
	for _, m := range allowed {
		if h.Attachments.Vision(m) {
			o.Vision = append(o.Vision, m)
		}
	}
	return o
}

// fillAttachments gives the messages of conversation id their files.
func (h *Handler) fillAttachments(c *fiber.Ctx, id string, msgs []views.ChatMessage) error {
	byMsg, err := h.Chat.AttachmentsOf(c.UserContext(), id)
	if err != nil || len(byMsg) == 0 {
		return err
	}
	for i := range msgs {
		for _, a := range byMsg[msgs[i].ID] {
			msgs[i].Attachments = append(msgs[i].Attachments, views.AttachmentView{ID: a.ID, Kind: a.Kind, Name: a.Name, Bytes: a.Bytes})
		}
	}
	return nil
}
