import PylonPluginKit

/// What the params of an `ma.eventRecord` say: the AppKey they name, and the event as it goes
/// into its record (name bytes, properties in Pylon's canonical form) or the -3 message of the
/// first check it fails (`EventValidation`).
///
/// Read by one reader, `read(_:)`, from the params' JSON text, building nothing per event
/// (docs/PROTOCOL.md "Canonical form"): keys and strings decoded, the last of a repeated key
/// winning.
package struct EventParams: Equatable {
    /// `params.appKey` when it is a string, as written (not trimmed).
    var appKey: String?
    /// `params.eventId`, decoded: the client's id for the event, which the device stores once
    /// however often it is sent (docs/MA.md, `ma.eventRecord`); nil when absent or `null`.
    var eventId: String?
    /// nil when the event passed every check; else the -3 message naming the field.
    package var invalid: String?
    /// Where `name` and `properties` point: nil for the params' text itself, else these bytes.
    var storage: [UInt8]?
    /// The event name's bytes (its string value).
    var name: Range<Int> = 0..<0
    /// The properties' JSON text in canonical form; nil when there are none.
    var properties: Range<Int>?

    /// Calls `body` with the event's name bytes and properties text (`{}` when none). `params`:
    /// the text this was read from.
    package func withEvent<R>(
        params: UnsafeRawBufferPointer, _ body: (_ name: UnsafeRawBufferPointer, _ properties: UnsafeRawBufferPointer) -> R
    )
        -> R
    {
        func call(_ t: UnsafeRawBufferPointer) -> R {
            let n = UnsafeRawBufferPointer(rebasing: t[name])
            guard let properties else { return EventParams.noProperties.withUnsafeBytes { body(n, $0) } }
            return body(n, UnsafeRawBufferPointer(rebasing: t[properties]))
        }
        guard let storage else { return call(params) }
        return storage.withUnsafeBytes { call($0) }
    }

    /// The longest client event id, in bytes: its record id (`c:` and the id) stays within the
    /// uploader's 128-byte id rule.
    static let maxEventIdBytes = 100
    static let eventIdInvalid = "eventId must be a string of 1-\(maxEventIdBytes) bytes without control characters"

    /// 1-100 bytes of UTF-8 without control characters (U+0000-U+001F, U+007F).
    static func isValidEventId(_ id: String) -> Bool {
        let n = id.utf8.count
        return n >= 1 && n <= maxEventIdBytes && !id.utf8.contains { $0 < 0x20 || $0 == 0x7F }
    }

    /// The properties of an event that has none.
    static let noProperties = Array("{}".utf8)

    private init() {}

    /// Reads params from their JSON text (valid JSON, as the host checked it).
    package static func read(_ t: UnsafeRawBufferPointer) -> EventParams {
        var p = EventParams()
        let first = RawJSON.skipSpace(t, 0)
        guard first < t.count, t[first] == UInt8(ascii: "{") else {
            p.invalid = EventValidation.nameRequired
            return p
        }
        // The last of a repeated key wins.
        var appKey: Range<Int>?
        var eventId: Range<Int>?
        var eventName: Range<Int>?
        var property: Range<Int>?
        /// The canonical length of `property` when it is an object.
        var canonical = 0
        var members = RawJSON.MemberCursor(t, first..<t.count)
        while let m = members.nextKey() {
            if RawJSON.keyIs(t, m.key, escaped: m.keyEscaped, "appKey") {
                appKey = members.skipValue()
            } else if RawJSON.keyIs(t, m.key, escaped: m.keyEscaped, "eventId") {
                eventId = members.skipValue()
            } else if RawJSON.keyIs(t, m.key, escaped: m.keyEscaped, "eventName") {
                eventName = members.skipValue()
            } else if RawJSON.keyIs(t, m.key, escaped: m.keyEscaped, "property") {
                guard t[m.valueStart] == UInt8(ascii: "{") else {
                    property = members.skipValue()
                    continue
                }
                // Measured and skipped in one walk.
                let (length, end) = RawJSON.canonical(t, at: m.valueStart)
                property = m.valueStart..<end
                canonical = length
                members.resume(at: end)
            }
        }
        if let s = appKey { p.appKey = RawJSON.stringValue(t, s) }
        if let s = eventId, !RawJSON.equals(t, s.lowerBound, s.upperBound, "null") {
            guard let id = RawJSON.stringValue(t, s), EventParams.isValidEventId(id) else {
                p.invalid = EventParams.eventIdInvalid
                return p
            }
            p.eventId = id
        }
        guard let n = eventName, t[n.lowerBound] == UInt8(ascii: "\"") else {
            p.invalid = EventValidation.nameRequired
            return p
        }
        var name = (n.lowerBound + 1)..<(n.upperBound - 1)
        let nameEscaped = RawJSON.contains(t, name, UInt8(ascii: "\\"))
        let decodedName = nameEscaped ? RawJSON.decode(t, name) : []
        let why =
            nameEscaped
            ? decodedName.withUnsafeBytes { EventValidation.checkName($0) }
            : EventValidation.checkName(UnsafeRawBufferPointer(rebasing: t[name]))
        if let why {
            p.invalid = why
            return p
        }
        guard let s = property, !RawJSON.equals(t, s.lowerBound, s.upperBound, "null") else {
            if nameEscaped { p.storage = decodedName }
            p.name = nameEscaped ? 0..<decodedName.count : name
            return p
        }
        guard t[s.lowerBound] == UInt8(ascii: "{") else {
            p.invalid = EventValidation.propertyNotObject
            return p
        }
        if !nameEscaped, canonical == s.count {
            // Already canonical: name and properties point into the params' text.
            if let why = EventValidation.checkProperties(text: t, s) {
                p.invalid = why
                return p
            }
            p.name = name
            p.properties = s
            return p
        }
        // The decoded name and the canonical properties go to storage.
        let nameBytes = nameEscaped ? decodedName.count : name.count
        var bytes = [UInt8](repeating: 0, count: nameBytes + s.count)
        let length = bytes.withUnsafeMutableBytes { out in
            if nameEscaped {
                decodedName.withUnsafeBytes { out.copyMemory(from: $0) }
            } else {
                out.copyMemory(from: UnsafeRawBufferPointer(rebasing: t[name]))
            }
            return RawJSON.canonical(t, at: s.lowerBound, into: out.baseAddress! + nameBytes).length
        }
        bytes.removeLast(bytes.count - nameBytes - length)
        name = 0..<nameBytes
        let props = nameBytes..<bytes.count
        if let why = bytes.withUnsafeBytes({ EventValidation.checkProperties(text: $0, props) }) {
            p.invalid = why
            return p
        }
        p.storage = bytes
        p.name = name
        p.properties = props
        return p
    }
}
