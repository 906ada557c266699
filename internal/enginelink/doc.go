// Package enginelink is the gateway's side of the engine protocol
// (docs/engine-protocol.md): one WebSocket per engine backend, dialled and
// redialled by a connector, carrying every session of this replica, with a
// SessionRouter that hands each reply to its own session only.
package enginelink
