import PylonCore

/// The user's time zone for automation (a wait until a time of day, the calendar day of a cap,
/// quiet hours): the profile property `timezone` (or the rule's `guards.timeZoneProperty`),
/// either an IANA name (`Europe/Berlin`, read from the system's zoneinfo, daylight saving
/// included) or a fixed offset (`UTC`, `+05:30`, `-0800`, `UTC+2`, `GMT-3`). Missing or not
/// understood: the rule's `guards.utcOffsetMinutes`.
enum AutomationTimeZone {
    /// Where IANA zone files are read.
    static let zoneinfo = "/usr/share/zoneinfo/"
    /// A zone name's bytes at most, and a zone file's.
    static let maxNameBytes = 64
    static let maxFileBytes = 64 << 10

    /// The offset from UTC in minutes at `now` (ms) that `value` names, or nil. `zone` answers
    /// an IANA name's parsed file (nil: unknown).
    static func offsetMinutes(_ value: JSON?, now: Int64, zone: (String) -> TZif?) -> Int? {
        guard let s = value?.stringValue, !s.isEmpty, s.utf8.count <= maxNameBytes else { return nil }
        if let fixed = fixedOffset(s) { return fixed }
        guard isZoneName(s), let z = zone(s) else { return nil }
        return z.offsetSeconds(at: now / 1000) / 60
    }

    /// `UTC`, `Z`, `+05:30`, `-0800`, `+2`, `UTC+2`, `GMT-03:00` → minutes; else nil.
    static func fixedOffset(_ s: String) -> Int? {
        var rest = Substring(s)
        for p in ["UTC", "GMT"] where rest.hasPrefix(p) { rest = rest.dropFirst(p.count) }
        if rest.isEmpty || rest == "Z" { return s == "Z" || s.count == 3 ? 0 : nil }
        guard let sign = rest.first, sign == "+" || sign == "-" else { return nil }
        rest = rest.dropFirst()
        let digits = rest.filter { $0 != ":" }
        guard !digits.isEmpty, digits.count <= 4, digits.allSatisfy(\.isASCII), digits.allSatisfy(\.isNumber) else { return nil }
        let h: Int
        let m: Int
        if rest.contains(":") {
            let parts = rest.split(separator: ":", omittingEmptySubsequences: false)
            guard parts.count == 2, let hh = Int(parts[0]), parts[1].count == 2, let mm = Int(parts[1]) else { return nil }
            (h, m) = (hh, mm)
        } else if digits.count <= 2 {
            (h, m) = (Int(digits) ?? 99, 0)
        } else {
            (h, m) = (Int(digits.dropLast(2)) ?? 99, Int(digits.suffix(2)) ?? 99)
        }
        guard h <= 14, m < 60 else { return nil }
        return (sign == "-" ? -1 : 1) * (h * 60 + m)
    }

    /// An IANA-like name: `Area/Location` parts of letters, digits, `_`, `+`, `-` (no `..`, no
    /// leading `/`): safe to join to `zoneinfo`.
    static func isZoneName(_ s: String) -> Bool {
        let parts = s.split(separator: "/", omittingEmptySubsequences: false)
        return parts.count <= 3
            && parts.allSatisfy { p in
                !p.isEmpty && p.first != "." && p.first != "-"
                    && p.unicodeScalars.allSatisfy {
                        $0.isASCII && ($0.properties.isAlphabetic || ("0"..."9").contains($0) || "_+-".unicodeScalars.contains($0))
                    }
            }
    }

    /// Reads and parses the zone file of `name` (nil: none, or not a TZif file).
    static func load(_ name: String) -> TZif? {
        guard isZoneName(name), let bytes = System.readFile(zoneinfo + name, limit: maxFileBytes) else { return nil }
        return TZif(bytes)
    }
}

/// A parsed TZif file (RFC 8536): its transitions and the UTC offset after each. The version 2+
/// (64-bit) block is read when present; a time after the last transition keeps its offset (the
/// system's files carry transitions up to 2037).
struct TZif: Equatable {
    var transitions: [Int64]
    var types: [UInt8]
    var offsets: [Int]
    /// The offset before the first transition.
    var initial: Int

    init?(_ b: [UInt8]) {
        func u32(_ i: Int) -> Int? {
            guard i + 4 <= b.count else { return nil }
            return Int(b[i]) << 24 | Int(b[i + 1]) << 16 | Int(b[i + 2]) << 8 | Int(b[i + 3])
        }
        func i64(_ i: Int) -> Int64? {
            guard i + 8 <= b.count else { return nil }
            var v: UInt64 = 0
            for k in 0..<8 { v = v << 8 | UInt64(b[i + k]) }
            return Int64(bitPattern: v)
        }
        func header(_ at: Int) -> (counts: [Int], body: Int)? {
            guard at + 44 <= b.count, b[at] == 0x54, b[at + 1] == 0x5A, b[at + 2] == 0x69, b[at + 3] == 0x66 else { return nil }
            var counts: [Int] = []
            for k in 0..<6 {
                guard let c = u32(at + 20 + 4 * k), c < 1 << 20 else { return nil }
                counts.append(c)
            }
            return (counts, at + 44)
        }
        guard let v1 = header(0) else { return nil }
        // isutcnt, isstdcnt, leapcnt, timecnt, typecnt, charcnt
        var (c, at) = v1
        var timeSize = 4
        if b[4] >= 0x32 {
            let skip = c[3] * 4 + c[3] + c[4] * 6 + c[5] + c[2] * 8 + c[1] + c[0]
            guard let v2 = header(at + skip) else { return nil }
            (c, at) = v2
            timeSize = 8
        }
        let timecnt = c[3]
        let typecnt = c[4]
        guard typecnt > 0, at + timecnt * (timeSize + 1) + typecnt * 6 <= b.count else { return nil }
        var transitions: [Int64] = []
        for k in 0..<timecnt {
            let p = at + k * timeSize
            if timeSize == 8 {
                guard let t = i64(p) else { return nil }
                transitions.append(t)
            } else {
                guard let t = u32(p) else { return nil }
                transitions.append(Int64(Int32(truncatingIfNeeded: t)))
            }
        }
        let typeAt = at + timecnt * timeSize
        let types = Array(b[typeAt..<typeAt + timecnt])
        var offsets: [Int] = []
        for k in 0..<typecnt {
            guard let o = u32(typeAt + timecnt + k * 6) else { return nil }
            offsets.append(Int(Int32(truncatingIfNeeded: o)))
        }
        guard types.allSatisfy({ Int($0) < typecnt }) else { return nil }
        self.transitions = transitions
        self.types = types
        self.offsets = offsets
        initial = offsets[0]
    }

    /// The UTC offset in seconds at `t` (seconds since the epoch).
    func offsetSeconds(at t: Int64) -> Int {
        var lo = 0
        var hi = transitions.count
        while lo < hi {
            let mid = (lo + hi) / 2
            if transitions[mid] <= t { lo = mid + 1 } else { hi = mid }
        }
        return lo == 0 ? initial : offsets[Int(types[lo - 1])]
    }
}
