/// Writing JSON text by hand, for the paths that build messages and records as bytes (envelopes,
/// MA event records, the uploader's batch bodies): the one string escaper and the one integer
/// writer. Strings are written as json-c writes them with `JSON_C_TO_STRING_NOSLASHESCAPE`: `"`
/// and `\` escaped, control characters as `\n`, `\t`… or `\u00XX`, everything else (UTF-8
/// included) as is.
public enum JSONText {
    public static func appendString(_ s: String, to out: inout [UInt8]) {
        var s = s
        s.withUTF8 { appendString(UnsafeRawBufferPointer($0), to: &out) }
    }

    public static func appendString(_ bytes: UnsafeRawBufferPointer, to out: inout [UInt8]) {
        out.append(UInt8(ascii: "\""))
        var start = 0
        for (i, c) in bytes.enumerated() where c < 0x20 || c == UInt8(ascii: "\"") || c == UInt8(ascii: "\\") {
            out.append(contentsOf: bytes[start..<i])
            start = i + 1
            out.append(UInt8(ascii: "\\"))
            switch c {
            case UInt8(ascii: "\""), UInt8(ascii: "\\"): out.append(c)
            case 0x0A: out.append(UInt8(ascii: "n"))
            case 0x0D: out.append(UInt8(ascii: "r"))
            case 0x09: out.append(UInt8(ascii: "t"))
            case 0x08: out.append(UInt8(ascii: "b"))
            case 0x0C: out.append(UInt8(ascii: "f"))
            default:
                out.append(contentsOf: [UInt8(ascii: "u"), 0x30, 0x30, hexDigits[Int(c >> 4)], hexDigits[Int(c & 0xF)]])
            }
        }
        out.append(contentsOf: bytes[start...])
        out.append(UInt8(ascii: "\""))
    }

    /// `value` in decimal (no allocation beyond `out`'s growth).
    public static func appendDecimal<T: BinaryInteger>(_ value: T, to out: inout [UInt8]) {
        if value < 0 { out.append(UInt8(ascii: "-")) }
        var v = UInt64(value.magnitude)
        withUnsafeTemporaryAllocation(of: UInt8.self, capacity: 20) { buf in
            var i = 20
            repeat {
                i -= 1
                buf[i] = UInt8(truncatingIfNeeded: v % 10) + UInt8(ascii: "0")
                v /= 10
            } while v > 0
            out.append(contentsOf: buf[i...])
        }
    }

    private static let hexDigits = Array("0123456789abcdef".utf8)
}
