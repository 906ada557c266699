// Package stop lets a person stop an inference from any gateway replica while
// the streaming path pays only an in-memory map look-up per token.
//
// A stop request may reach any replica. The Service there broadcasts it on a
// Bus (Redis pub/sub across replicas, or in-process for a single one); every
// replica records it in its Holder, and the replica that owns the stream is
// woken through the watcher it registered with Begin. The owner ends the
// stream, cancels the upstream, and calls Run.Ack; the ack travels back and
// Request returns, so that after the stop endpoint answers 200 no more
// content reaches the client. Request gives up after a bound (2 s by default)
// and says so.
//
// Pub/sub alone loses messages published while a replica is not subscribed.
// Each broadcast stop therefore also writes a key "<prefix>stop:<id>" with a
// TTL, in the same MULTI as the PUBLISH. The key is read only at moments that
// are not per token: once when an inference begins (a stop that raced ahead of
// the start) and once, for all running inferences in one pipeline, after every
// re-subscription (a stop published while the replica was disconnected).
//
// Known limit, shared with the design this follows: if the owning process dies
// the stop is never acknowledged, and Request reports a timeout; the stream
// has died with the process anyway.
package stop
