import CCrypto
import PylonCore

/// Broker credentials the broker checks without per-device state (`--mqtt-auth-key-file`; the
/// mosquitto plugin `tools/mosquitto-auth/pylon_auth.c`, docs/FLEET.md "Stateless broker
/// credentials"). Registering a device costs the broker nothing: the backend signs a token,
/// `pm1.<kid>.<expiry s>.<hex HMAC-SHA256(key, "pm1.<kid>.<expiry>\n<username>\n<client id>")>`,
/// returned as the device's broker password; the plugin recomputes it from the username and
/// client id the device connects with.
package struct MQTTAuth: Sendable {
    let kid: String
    let key: [UInt8]

    /// How long a device's broker token is valid; a device refused after that registers again
    /// with its device token and gets a new one (docs/PUSH.md).
    static let deviceTokenS: Int64 = 30 * 86_400
    /// How long the backend's own broker login is valid (signed at start; restart within it).
    static let backendTokenS: Int64 = 365 * 86_400
    static let kidRule = "1 to 16 of [A-Za-z0-9_-]"
    /// The backend's broker username when `--mqtt-username` names none (the plugin's
    /// `plugin_opt_backend_user`).
    package static let backendUser = "pylon-backend"

    /// The backend's own broker password (any client id), valid `backendTokenS` from now.
    package func backendToken(username: String) -> String {
        token(username: username, clientId: "*", nowS: System.wallClockMs() / 1000, validS: MQTTAuth.backendTokenS)
    }

    /// The key in `path`: a 0600 file holding `<kid>:<hex key>` (16 to 64 bytes of key).
    package static func load(_ path: String) -> Result<MQTTAuth, LoadError> {
        switch SecretFile.read(path) {
        case .failure(let e): return .failure(LoadError(description: e.description))
        case .success(let bytes):
            let text = String(decoding: bytes, as: UTF8.self)
            guard let colon = text.firstIndex(of: ":"), let key = hexBytes(text[text.index(after: colon)...]),
                (16...64).contains(key.count), case let kid = String(text[..<colon]), validKid(kid)
            else {
                return .failure(LoadError(description: "\(path) must hold <kid>:<hex key> (kid \(kidRule), key 16 to 64 bytes)"))
            }
            return .success(MQTTAuth(kid: kid, key: key))
        }
    }

    package struct LoadError: Error, CustomStringConvertible {
        package var description: String
    }

    static func validKid(_ s: String) -> Bool {
        (1...16).contains(s.utf8.count)
            && s.utf8.allSatisfy { c in
                (0x30...0x39).contains(c) || (0x41...0x5A).contains(c) || (0x61...0x7A).contains(c) || c == 0x2D || c == 0x5F
            }
    }

    static func hexBytes(_ s: Substring) -> [UInt8]? {
        let u = Array(s.utf8)
        guard u.count % 2 == 0 else { return nil }
        func v(_ c: UInt8) -> UInt8? {
            switch c {
            case 0x30...0x39: c - 0x30
            case 0x61...0x66: c - 0x61 + 10
            case 0x41...0x46: c - 0x41 + 10
            default: nil
            }
        }
        var out: [UInt8] = []
        out.reserveCapacity(u.count / 2)
        for i in stride(from: 0, to: u.count, by: 2) {
            guard let hi = v(u[i]), let lo = v(u[i + 1]) else { return nil }
            out.append(hi << 4 | lo)
        }
        return out
    }

    /// The token for `username` connecting with `clientId` ("*": any client id, the backend's
    /// own login), valid until `nowS + validS`.
    func token(username: String, clientId: String, nowS: Int64, validS: Int64) -> String {
        let head = "pm1.\(kid).\(nowS + validS)"
        let mac = MQTTAuth.hmacSHA256(key: key, Array((head + "\n" + username + "\n" + clientId).utf8))
        return head + "." + mac.map { String($0, radix: 16).leftPad(2) }.joined()
    }

    /// HMAC-SHA256 (RFC 2104) of `message` with a key of at most 64 bytes.
    static func hmacSHA256(key: [UInt8], _ message: [UInt8]) -> [UInt8] {
        var k = key
        k.append(contentsOf: [UInt8](repeating: 0, count: 64 - key.count))
        func sha(_ d: [UInt8]) -> [UInt8] {
            var out = [UInt8](repeating: 0, count: 32)
            pylon_sha256(d, d.count, &out)
            return out
        }
        let inner = sha(k.map { $0 ^ 0x36 } + message)
        return sha(k.map { $0 ^ 0x5C } + inner)
    }
}
