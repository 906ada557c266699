// Package stop lets a person stop an inference from any gateway replica while
// the streaming path pays only an in-memory map look-up per token.
//
// A stop request may reach any replica. The replica that runs the inference
// registered it with Begin, for the person it runs for, so that replica
// decides: the stop carries its Caller, and the runner stops the run only if
// the caller may (the usage row's rule: their own, or anyone's for an
// administrator). If the replica that takes the request runs the inference,
// nothing leaves it. Otherwise the Service broadcasts the stop on a Bus
// (Redis pub/sub across replicas, or in-process for a single one), and every
// replica that hears it answers: the runner ends the stream, cancels the
// upstream and, once Run.Ack says no more content can reach the client,
// answers "ack" (or "finished", with the outcome, if it had just ended);
// every other replica answers "none". Someone else's inference gets "none"
// from its runner too, so it cannot be told from an unknown id. The
// publish's count of receivers says how many answers to expect: when all
// say none, RequestAs returns NoOwner at once, and the caller looks in
// storage (an inference finished a while ago, or run by a replica cut off
// from the bus). Nothing waits for storage while a replica can answer.
//
// Pub/sub alone loses messages published while a replica is not subscribed.
// Each broadcast stop therefore also adds itself (caller, replica, request
// number) to a set "<prefix>stops:<id>" with a TTL, in the same MULTI as the
// PUBLISH. The key is read only at moments that are not per token: once when
// an inference begins with an id that was out before (Begin: a stop may have
// raced ahead of the start; the gateway's /v1 ids and the chat's replies are
// registered before their id leaves the replica, BeginFresh, which skips
// it) and once, for all running inferences in one pipeline, after every
// re-subscription (a stop published while the replica was disconnected); a
// stop found there whose caller may make it is applied, and its request
// answered if it still waits.
//
// Known limit, shared with the design this follows: if the owning process dies
// the stop is never acknowledged, and the request ends with NoOwner (Redis
// dropped the subscription) or times out; the stream has died with the
// process anyway.
package stop
