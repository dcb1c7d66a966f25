import FuzzSupport
import PylonCore

/// Fuzz target (a): the host's input path for one connection. The input is cut into reads of
/// input-derived sizes and fed to `LineFramer`; every line goes through
/// `RawJSON.classifyMessage` and json-c (`Tokener`) with the host's depth setting (both
/// `maxDepth`, as in `Bus.handleLine`).
///
/// Properties (a failure traps, so libFuzzer keeps the input):
/// - the framer yields exactly the input's complete lines, lines over the limit as `.oversized`
///   with the right byte count and a head that is the line's start, never a line containing `\n`;
/// - the scanner never accepts what json-c rejects;
/// - `RawJSON.hostMessageSpans` (the plugin kit's reader) stays inside any line and, where the
///   scanner accepts, finds the scanner's spans;
/// - where the scanner accepts, its `id` span is the one a reader decoding keys finds, and the
///   plain `method` string and plain integer `id` it finds are what json-c parsed;
/// - the one reader of message-shaped JSON (`RawJSON.validate`, `canonical`) never accepts what
///   json-c rejects; on a text it accepts, the canonical form is valid, stable (its own canonical
///   form) and read by json-c as the same value.
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzOne(_ data: UnsafePointer<UInt8>?, _ size: Int) -> CInt {
    guard let data, size > 0 else { return 0 }
    let all = UnsafeRawBufferPointer(start: data, count: size)
    // First byte: the limits. Small line limits make oversized lines reachable.
    let b0 = Int(all[0])
    let maxLine = 16 + (b0 & 0x0F) * 64  // 16 ... 976 bytes
    let maxDepth = Int32(2 + (b0 >> 4) * 4)  // 2 ... 62 (the host's minimum is 2)
    let input = UnsafeRawBufferPointer(rebasing: all[1...])
    var rng = InputRNG(input)
    let tokener = Tokener(maxDepth: maxDepth)

    // Expected framing: the complete lines of the input.
    var expected: [Range<Int>] = []
    var start = 0
    for i in 0..<input.count where input[i] == 0x0A {
        expected.append(start..<i)
        start = i + 1
    }

    var framer = LineFramer(maxLineBytes: maxLine)
    var seen = 0
    var offset = 0
    while offset < input.count {
        let n = min(input.count - offset, 1 + Int(rng.next() % 96))
        framer.feed(UnsafeRawBufferPointer(rebasing: input[offset..<(offset + n)])) { (event: LineFramer.Event) -> Void in
            fuzzCheck(seen < expected.count, "framer emitted more lines than the input has")
            let want = UnsafeRawBufferPointer(rebasing: input[expected[seen]])
            seen += 1
            switch event {
            case .line(let line):
                fuzzCheck(line.count <= maxLine, "line of \(line.count) bytes over the limit \(maxLine)")
                fuzzCheck(line.elementsEqual(want), "line bytes differ from the input's line")
                check(line, tokener: tokener, maxDepth: maxDepth)
            case .oversized(let bytes, let head):
                fuzzCheck(want.count > maxLine, "a line within the limit was reported oversized")
                fuzzCheck(bytes == want.count, "oversized byte count \(bytes), line has \(want.count)")
                // The head is the line's start: the bytes the framer still held when it began
                // discarding, so at least min(headBytes, maxLine + 1) of them.
                fuzzCheck(want.starts(with: head), "oversized head is not the line's start")
                fuzzCheck(head.count >= min(LineFramer.headBytes, maxLine + 1), "oversized head of only \(head.count) bytes")
                head.withUnsafeBytes { _ = RawJSON.memberValueSpan($0, key: "id") }
            }
        }
        offset += n
    }
    fuzzCheck(seen == expected.count, "framer emitted \(seen) lines, input has \(expected.count)")
    fuzzCheck(framer.isDiscarding || framer.bufferedBytes == input.count - start, "carry is not the unterminated tail")
    return 0
}

let idKey: StaticString = "id"

func check(_ line: UnsafeRawBufferPointer, tokener: Tokener, maxDepth: Int32) {
    let scan = RawJSON.classifyMessage(line, maxDepth: Int(maxDepth))
    let parsed = try? tokener.parse(line)
    checkCanonical(line, parsed: parsed, tokener: tokener, maxDepth: maxDepth)
    let idSpan = RawJSON.member(
        line, RawJSON.skipSpace(line, 0)..<line.count, named: UnsafeRawBufferPointer(start: idKey.utf8Start, count: 2))
    // The plugin kit's finder for host-validated lines: on any bytes, spans inside the line; on
    // a line the scanner accepts, the scanner's spans.
    let host = RawJSON.hostMessageSpans(line)
    if let h = host {
        for span in [h.jsonrpc, h.id, h.method, h.params, h.result, h.error, h.pylon, h.onBehalfOf] {
            if let span { fuzzCheck(span.lowerBound >= 0 && span.upperBound <= line.count && !span.isEmpty, "host span out of the line") }
        }
    }
    if case .message(let m) = scan { fuzzCheck(host == m, "hostMessageSpans differs from the scanner on a valid line") }
    guard case .message(let m) = scan else {
        if case .invalid(let at) = scan { fuzzCheck(at >= 0 && at <= line.count, "invalid(at:) outside the line") }
        return
    }
    fuzzCheck(parsed != nil, "scanner accepted what json-c rejects: \(String(decoding: line, as: UTF8.self))")
    guard let parsed else { return }
    fuzzCheck(idSpan == m.id, "id span differs from the decoding reader's")
    for span in [m.jsonrpc, m.id, m.method, m.params, m.result, m.error, m.pylon, m.onBehalfOf] {
        if let span { fuzzCheck(span.lowerBound >= 0 && span.upperBound <= line.count && !span.isEmpty, "span out of the line") }
    }
    let j = parsed.json
    if let s = m.method, let text = RawJSON.plainString(line, s) {
        fuzzCheck(j["method"]?.stringValue == text, "method \(text) differs from json-c's \(String(describing: j["method"]))")
    }
    if let s = m.id, let n = RawJSON.plainInt(line, s) {
        fuzzCheck(j["id"]?.intValue == n, "id \(n) differs from json-c's \(String(describing: j["id"]))")
    }
    fuzzCheck((m.params != nil) == (j["params"] != nil), "params presence differs from json-c")
}

/// The one reader's properties (see the target's comment).
func checkCanonical(_ line: UnsafeRawBufferPointer, parsed: JSONRef?, tokener: Tokener, maxDepth: Int32) {
    let start = RawJSON.skipSpace(line, 0)
    let (_, end) = RawJSON.canonical(line, at: start)  // any bytes: stays inside the line
    fuzzCheck(end >= start && end <= line.count, "canonical walked outside the line")
    guard RawJSON.validate(line, maxDepth: Int(maxDepth)) == .valid else { return }
    fuzzCheck(parsed != nil, "validate accepted what json-c rejects: \(String(decoding: line, as: UTF8.self))")
    guard let parsed else { return }
    let c = RawJSON.canonicalBytes(line, at: start)
    c.withUnsafeBytes { c in
        fuzzCheck(RawJSON.validate(c, maxDepth: Int(maxDepth)) == .valid, "canonical form is not valid JSON")
        fuzzCheck(RawJSON.canonicalBytes(c).elementsEqual(c), "canonical form is not stable")
        guard let again = try? tokener.parse(c) else {
            fuzzCheck(false, "json-c rejects the canonical form")
            return
        }
        fuzzCheck(again.json.isSameValue(as: parsed.json), "json-c reads the canonical form as another value")
    }
}

@main struct Main {
    static func main() { FuzzMain.run(fuzzOne) }
}
