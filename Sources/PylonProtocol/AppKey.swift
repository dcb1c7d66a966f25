/// An app's key (MA AppKey, push appId, tag-manager container id): the one naming rule the
/// plugins and the reference backend share. 1 to `maxBytes` bytes of `[A-Za-z0-9._-]`, not `.` or
/// `..` — safe as a URL path segment, a file name and a consent-switch suffix.
public enum AppKey {
    public static let maxBytes = 64

    public static func isValid(_ s: String) -> Bool {
        let u = s.utf8
        guard (1...maxBytes).contains(u.count), s != ".", s != ".." else { return false }
        return u.allSatisfy { c in
            (0x30...0x39).contains(c) || (0x41...0x5A).contains(c) || (0x61...0x7A).contains(c)
                || c == UInt8(ascii: ".") || c == UInt8(ascii: "_") || c == UInt8(ascii: "-")
        }
    }

    /// The rule in words, for error messages.
    public static let rule = "1 to \(maxBytes) characters of A-Z a-z 0-9 . _ - (not . or ..)"
}
