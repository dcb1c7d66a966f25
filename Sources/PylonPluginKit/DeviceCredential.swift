import PylonCore

#if canImport(Glibc)
import Glibc
#endif

/// The device credential plugins present to the backend (`Authorization: Bearer <token>`):
/// the file a plugin's `credentialFile` setting names (docs/SECURITY.md, "Backend"). It is read
/// on every use, so a rotated or newly issued credential takes effect without a restart. The
/// file must be a regular file without group or other permissions (0600 or 0400) holding 16 to
/// 4096 printable ASCII characters (a trailing newline is ignored).
public enum DeviceCredential {
    public static let minBytes = 16
    public static let maxBytes = 4096

    /// The token in `path`, or why there is none.
    public static func load(_ path: String) -> Result<String, CredentialError> {
        var st = stat()
        guard stat(path, &st) == 0 else { return .failure(CredentialError("\(path): \(String(cString: strerror(errno)))")) }
        guard (st.st_mode & S_IFMT) == S_IFREG else { return .failure(CredentialError("\(path) is not a regular file")) }
        guard st.st_mode & 0o077 == 0 else {
            return .failure(CredentialError("\(path) is readable by group or others (mode must be 0600 or 0400)"))
        }
        guard let raw = System.readFile(path, limit: maxBytes + 2) else { return .failure(CredentialError("\(path) cannot be read")) }
        var b = raw[...]
        while let l = b.last, l == 0x0A || l == 0x0D || l == 0x20 || l == 0x09 { b = b.dropLast() }
        guard (minBytes...maxBytes).contains(b.count), b.allSatisfy({ (0x21...0x7E).contains($0) }) else {
            return .failure(CredentialError("\(path) must hold \(minBytes) to \(maxBytes) printable ASCII characters"))
        }
        return .success(String(decoding: b, as: UTF8.self))
    }

    /// `[("Authorization", "Bearer <token>")]` from `path`, or no header (and a warning in `log`,
    /// once per distinct reason) when `path` is nil or unusable: the backend then answers 401.
    public static func headers(_ path: String?, log: Log) -> [(String, String)] {
        guard let path else { return [] }
        switch load(path) {
        case .success(let t): return [("Authorization", "Bearer " + t)]
        case .failure(let e):
            Warned.once(e.description) { log.warn("device credential unusable", ["error": e.description]) }
            return []
        }
    }

    /// Writes `token` to `path` with mode 0600 (`System.writeFileAtomically`: a new temporary
    /// file, never one a link points to, renamed over it).
    public static func store(_ token: String, at path: String) -> Bool {
        System.writeFileAtomically(path, Array((token + "\n").utf8), mode: 0o600)
    }

    public struct CredentialError: Error, CustomStringConvertible {
        public let description: String
        init(_ d: String) { description = d }
    }

    /// Reasons already logged (the loop thread only).
    private enum Warned {
        nonisolated(unsafe) static var seen: Set<String> = []
        static func once(_ key: String, _ body: () -> Void) {
            guard seen.count < 64, seen.insert(key).inserted else { return }
            body()
        }
    }
}
