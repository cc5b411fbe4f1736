package leaseproxy

import "strings"

// maxLine bounds one event-stream line, and one message's data.
const maxLine = 1 << 20

// sseMessage is one dispatched Server-Sent Events message.
type sseMessage struct {
	id, event, data string
	hasID, hasData  bool
}

// sseParser parses text/event-stream bytes into messages whatever the chunk boundaries (the
// HTML standard's rules: lines end in \n, \r or \r\n; a blank line dispatches; ":" starts a
// comment). Past maxLine in a line or a message's data it stops taking input (overflowed):
// the connection must be dropped, and the message being read is lost.
type sseParser struct {
	line       []byte
	afterCR    bool
	pending    sseMessage
	overflowed bool
}

func (p *sseParser) feed(b []byte) []sseMessage {
	var out []sseMessage
	for _, ch := range b {
		if p.overflowed {
			break
		}
		if p.afterCR {
			p.afterCR = false
			if ch == '\n' {
				continue
			}
		}
		switch {
		case ch == '\n' || ch == '\r':
			p.afterCR = ch == '\r'
			line := p.line
			p.line = p.line[:0:0]
			if m, ok := p.lineEnded(line); ok {
				out = append(out, m)
			}
		case len(p.line) >= maxLine:
			p.overflow()
		default:
			p.line = append(p.line, ch)
		}
	}
	return out
}

func (p *sseParser) overflow() {
	p.overflowed = true
	p.line = nil
	p.pending = sseMessage{}
}

// lineEnded handles one complete line; a blank line dispatches the pending message.
func (p *sseParser) lineEnded(line []byte) (sseMessage, bool) {
	if len(line) == 0 {
		m := p.pending
		p.pending = sseMessage{}
		return m, m != (sseMessage{})
	}
	if line[0] == ':' {
		return sseMessage{}, false
	}
	text := strings.ToValidUTF8(string(line), "\uFFFD")
	field, value := text, ""
	if i := strings.IndexByte(text, ':'); i >= 0 {
		field, value = text[:i], strings.TrimPrefix(text[i+1:], " ")
	}
	switch field {
	case "id":
		if !strings.ContainsRune(value, 0) {
			p.pending.id, p.pending.hasID = value, true
		}
	case "event":
		p.pending.event = value
	case "data":
		if !p.pending.hasData {
			p.pending.data, p.pending.hasData = value, true
		} else if len(p.pending.data)+1+len(value) > maxLine {
			p.overflow()
		} else {
			p.pending.data += "\n" + value
		}
	}
	return sseMessage{}, false
}
