package responses

// event begins a Responses event frame: its event line, and its data up to
// the sequence number, which counts the stream's events from 0. The caller
// appends the event's other members and ends it with endEvent.
func (s *Stream) event(typ string) {
	s.out = append(s.out, "event: "...)
	s.out = append(s.out, typ...)
	s.out = append(s.out, "\ndata: {\"type\":\""...)
	s.out = append(s.out, typ...)
	s.out = append(s.out, `","sequence_number":`...)
	s.out = appendInt(s.out, s.seq)
	s.seq++
}

func (s *Stream) endEvent() { s.out = append(s.out, "}\n\n"...) }

// itemRef appends the members that locate an event in the output: item_id
// and output_index (and content_index 0 for the message's one text part).
func (s *Stream) itemRef(id []byte, output int, content bool) {
	s.out = append(s.out, `,"item_id":`...)
	s.out = append(s.out, id...)
	s.out = append(s.out, `,"output_index":`...)
	s.out = appendInt(s.out, int64(output))
	if content {
		s.out = append(s.out, `,"content_index":0`...)
	}
}
