import PylonCore

#if canImport(Glibc)
import Glibc
#endif

/// The device credential plugins present to the backend (`Authorization: Bearer <token>`):
/// the file a plugin's `credentialFile` setting names (docs/SECURITY.md, "Backend"). It is read
/// on every use, so a rotated or newly issued credential takes effect without a restart. The
/// file follows `SecretFile`'s rule (0600 or 0400, 16 to 4096 printable ASCII characters).
public enum DeviceCredential {
    /// The token in `path`, or why there is none.
    public static func load(_ path: String) -> Result<String, SecretFile.Failure> {
        SecretFile.read(path).map { String(decoding: $0, as: UTF8.self) }
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

    /// Reasons already logged (the loop thread only).
    private enum Warned {
        nonisolated(unsafe) static var seen: Set<String> = []
        static func once(_ key: String, _ body: () -> Void) {
            guard seen.count < 64, seen.insert(key).inserted else { return }
            body()
        }
    }
}
