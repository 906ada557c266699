package mockllm

import (
	"hash/fnv"
	"strings"
)

// stories are the texts the mock "generates". They are short, readable and
// original so that a demo looks like a model talking, and fixed so that tests
// can predict every token. Paragraph breaks are not kept: the text is split
// into whitespace-separated words.
var stories = []string{
	`Once upon a time, in a small village by the sea, there lived a little girl
named Mia. Every morning she walked to the harbour to watch the fishing boats
come home. One day she found a shiny blue shell on the sand. When she held it
to her ear, she heard a tiny voice say, "Please help me find my way back to the
reef." Mia was surprised, but she was also brave. She asked her grandfather to
lend her his old red rowing boat. Together they rowed past the lighthouse,
over the gentle waves, until the water turned clear and green. Below them they
could see bright fish and swaying weeds. Mia leaned over the side and gently
placed the shell in the water. A small crab climbed out of it, waved one claw
and sank slowly towards the coral. "Thank you, Mia," called the tiny voice. On
the way home the sun began to set, and the whole sky turned orange and pink.
Her grandfather smiled and said that kindness is like a pebble thrown into a
pond, because its ripples travel much further than you can see. That night
Mia fell asleep listening to the sea, and she dreamed of crabs dancing on the
reef. From then on, whenever she found a shell on the beach, she held it to
her ear, just in case someone else needed a little help to find the way home.`,

	`Once upon a time, a small brown rabbit named Pip lived at the edge of a big
green meadow. Pip loved carrots more than anything in the world, but this year
the garden had not grown a single one. The rain had stayed away for many weeks
and the ground was dry and hard. Pip decided to ask his friends for help. The
old tortoise told him that patience is the best tool a gardener can have. The
busy squirrel showed him where the stream still ran cool and clear beneath the
willow trees. The wise owl, who knew a great many things, explained that seeds
need water, sunshine and a little bit of time. So every morning Pip carried
water from the stream in a leaf shaped like a cup. He poured it carefully over
each small row. It was hard work, and some days his paws were very tired, but
he did not give up. Slowly, tiny green shoots pushed up through the soil. The
shoots grew taller and taller, and at last, one sunny afternoon, Pip pulled up
the biggest orange carrot he had ever seen. He did not eat it all by himself.
Instead he invited the tortoise, the squirrel and the owl to a picnic under
the willow trees, and they shared the carrot and laughed until the stars came
out. Pip learned that good things grow when friends help each other.`,

	`Once upon a time, there was a tiny robot named Bolt who lived in a busy toy
shop in the middle of a big city. Bolt could roll, beep and blink his little
yellow lights, but he could not dance like the wind-up ballerina on the top
shelf. Every night, when the shop was dark and quiet, Bolt practised his
moves. He spun too fast and bumped into the teddy bears. He jumped too high
and landed in a box of marbles. The other toys giggled, but the ballerina
rolled over to him and said, "Everyone dances in a different way. Try
dancing like a robot." Bolt thought about this for a long time. Then he began
to move to the ticking of the old clock on the wall. Beep, spin, blink. Beep,
spin, blink. His lights flashed in time with the music, and soon the teddy
bears were clapping their soft paws. The toy soldiers marched along, and even
the grumpy jack-in-the-box popped up to watch. When the shopkeeper opened the
door the next morning, she found all the toys in a circle around a tiny robot
with glowing lights. She smiled, because she thought she must have dreamed it.
But Bolt knew it was real. He had found his very own dance, and it was the
best dance in the whole toy shop.`,
}

// storyWords holds stories split into words, computed once.
var storyWords = func() [][]string {
	out := make([][]string, len(stories))
	for i, s := range stories {
		out[i] = strings.Fields(s)
	}
	return out
}()

// CompletionTokens returns the n tokens the mock answers to a conversation
// whose last user message is lastUser. The story is chosen by a hash of that
// message; tokens are words with their leading space kept, and the story
// repeats when more tokens are asked for than it has words. Exposed so that
// tests elsewhere can predict the content that passes through the gateway.
func CompletionTokens(lastUser string, n int) []string {
	if n <= 0 {
		return nil
	}
	words := storyFor(lastUser)
	toks := make([]string, n)
	for i := range toks {
		w := words[i%len(words)]
		if i > 0 {
			w = " " + w
		}
		toks[i] = w
	}
	return toks
}

// EndsSentence reports whether tok, a token of an answer, ends a sentence:
// its last character, past closing quotes and brackets, is '.', '!' or '?'.
// A story answer whose length the mock chose finishes "stop" only when its
// last token ends a sentence; otherwise it was cut, and finishes "length",
// as a real engine's answer cut by its own token limit does.
func EndsSentence(tok string) bool {
	t := strings.TrimRight(tok, `"')]”’`)
	return strings.HasSuffix(t, ".") || strings.HasSuffix(t, "!") || strings.HasSuffix(t, "?")
}

// SentenceLength returns how many tokens the answer to lastUser has when
// it must end at a sentence and should be about n tokens long: up to the
// last sentence end within the first n tokens, or, when the first sentence
// is longer than n, up to its end. CompletionTokens(lastUser,
// SentenceLength(lastUser, n)) is the answer of a server with
// Options.WholeSentences to a request that sets no length.
func SentenceLength(lastUser string, n int) int {
	if n <= 0 {
		return 0
	}
	words := storyFor(lastUser)
	for k := n; k > 0; k-- {
		if EndsSentence(words[(k-1)%len(words)]) {
			return k
		}
	}
	for k := n + 1; ; k++ { // Every story ends with a sentence.
		if EndsSentence(words[(k-1)%len(words)]) {
			return k
		}
	}
}

// storyFor picks the story's words by a hash of the last user message.
func storyFor(lastUser string) []string {
	h := fnv.New32a()
	_, _ = h.Write([]byte(lastUser)) // hash.Hash.Write never fails.
	return storyWords[h.Sum32()%uint32(len(storyWords))]
}

// CompletionText returns the concatenation of CompletionTokens(lastUser, n),
// i.e. the full content of the answer.
func CompletionText(lastUser string, n int) string {
	return strings.Join(CompletionTokens(lastUser, n), "")
}

// EchoPrefix starts a message the mock answers with the rest of that
// message, verbatim, so that tests and demos can make "the model" write
// what they need: Markdown, code, hostile HTML.
const EchoPrefix = "/echo "

// EchoTokens splits text into tokens of up to four characters, keeping
// every byte, as a model streams it.
func EchoTokens(text string) []string {
	var toks []string
	r := []rune(text)
	for len(r) > 0 {
		n := min(4, len(r))
		toks = append(toks, string(r[:n]))
		r = r[n:]
	}
	return toks
}
