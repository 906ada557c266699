package chat

import (
	"crypto/sha256"
	"encoding/binary"

	lru "github.com/hashicorp/golang-lru/v2"
)

// Rendering a finished answer as Markdown costs milliseconds (5–6 ms for
// 4 KB with two code blocks), and a conversation's page draws every answer
// in it on every load: the rendered HTML of recent answers is kept, by the
// hash of what it was rendered from. Answers longer than maxCachedRender
// are rendered each time, so the cache holds at most renderCacheSize × that
// (32 MiB) however long the answers.
const (
	renderCacheSize = 512
	maxCachedRender = 64 << 10
)

func newRenderCache() *lru.Cache[[32]byte, string] {
	c, err := lru.New[[32]byte, string](renderCacheSize)
	if err != nil {
		panic(err) // only for a size ≤ 0
	}
	return c
}

// renderKey identifies a final state by everything the HTML shows.
func renderKey(f Final) [32]byte {
	h := sha256.New()
	for _, part := range []string{f.Status, f.Reason, f.Content} {
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(part)))
		h.Write(n[:])
		h.Write([]byte(part))
	}
	var n [24]byte
	binary.BigEndian.PutUint64(n[:], uint64(f.PromptTokens))
	binary.BigEndian.PutUint64(n[8:], uint64(f.CompletionTokens))
	binary.BigEndian.PutUint64(n[16:], uint64(f.Cost))
	h.Write(n[:])
	var k [32]byte
	h.Sum(k[:0])
	return k
}
