import CPlist
import PylonCore
import PylonTagEngine

/// Default containers from the configured directory, named by container id with no version
/// suffix. Precedence: `<id>` (the full container, the only form with rules, macros and tags)
/// over `<id>.plist` over `<id>.json` (plain key → value maps).
enum DefaultContainers {
    struct Loaded {
        let container: Container
        /// Which file it came from (for logs and `gtm.status`).
        let file: String
    }

    /// The default container for `id`, nil when the directory has none, or an error naming the
    /// file and the cause when the chosen file is unusable (the caller logs it and starts empty:
    /// a broken default never blocks opening).
    static func load(id: String, dir: String, maxBytes: Int, limits: EngineLimits) -> Result<Loaded, ContainerError>? {
        guard !dir.isEmpty, GTMLimits.validContainerId(id) else { return nil }
        let base = dir + "/" + id
        switch contents(base, maxBytes: maxBytes) {
        case nil: break
        case .failure(let e)?: return .failure(e)
        case .success(let bytes)?:
            do {
                return .success(
                    Loaded(container: try Container.parse(text: String(decoding: bytes, as: UTF8.self), limits: limits), file: base))
            } catch {
                return .failure(ContainerError("\(base): \(error.description)"))
            }
        }
        switch contents(base + ".plist", maxBytes: maxBytes) {
        case nil: break
        case .failure(let e)?: return .failure(e)
        case .success(let bytes)?:
            do {
                let j = try PropertyList.parse(bytes)
                return .success(Loaded(container: try Container.plain(j, limits: limits), file: base + ".plist"))
            } catch {
                return .failure(ContainerError("\(base).plist: \(error.description)"))
            }
        }
        switch contents(base + ".json", maxBytes: maxBytes) {
        case nil: break
        case .failure(let e)?: return .failure(e)
        case .success(let bytes)?:
            let j: JSON
            do { j = try JSON.parse(String(decoding: bytes, as: UTF8.self), maxDepth: 64) } catch {
                return .failure(ContainerError("\(base).json: not valid JSON: \(error.description)"))
            }
            do {
                return .success(Loaded(container: try Container.plain(j, limits: limits), file: base + ".json"))
            } catch {
                return .failure(ContainerError("\(base).json: \(error.description)"))
            }
        }
        return nil
    }

    /// A candidate file's bytes: nil when it does not exist (the next form is tried), an error
    /// naming it when it exists but cannot be used (unreadable, or larger than `maxBytes`).
    private static func contents(_ path: String, maxBytes: Int) -> Result<[UInt8], ContainerError>? {
        do throws(IOError) {
            return .success(try System.readFile(atPath: path, maxBytes: maxBytes))
        } catch  where error.errnoCode == ENOENT {
            return nil
        } catch  where error.errnoCode == EFBIG {
            return .failure(ContainerError("\(path): larger than \(maxBytes) bytes"))
        } catch {
            return .failure(ContainerError("\(path): \(error)"))
        }
    }
}

/// XML and binary property lists through libplist, converted to JSON values (dates become
/// seconds since 2001-01-01 as doubles, data becomes base16 text, UIDs integers).
enum PropertyList {
    static let maxDepth = 64

    static func parse(_ bytes: [UInt8]) throws(ContainerError) -> JSON {
        var root: plist_t?
        bytes.withUnsafeBufferPointer { b in
            b.withMemoryRebound(to: CChar.self) { plist_from_memory($0.baseAddress, UInt32($0.count), &root) }
        }
        guard let root else { throw ContainerError("not a valid property list (XML or binary)") }
        defer { plist_free(root) }
        return try convert(root, depth: 0)
    }

    private static func convert(_ n: plist_t, depth: Int) throws(ContainerError) -> JSON {
        guard depth < maxDepth else { throw ContainerError("property list nested deeper than \(maxDepth)") }
        switch plist_get_node_type(n) {
        case PLIST_BOOLEAN:
            var v: UInt8 = 0
            plist_get_bool_val(n, &v)
            return .bool(v != 0)
        case PLIST_UINT:
            var v: UInt64 = 0
            plist_get_uint_val(n, &v)
            return .int(Int64(bitPattern: v))  // libplist stores negative integers this way
        case PLIST_REAL:
            var v = 0.0
            plist_get_real_val(n, &v)
            return .double(v)
        case PLIST_STRING, PLIST_KEY:
            var p: UnsafeMutablePointer<CChar>?
            plist_get_string_val(n, &p)
            defer { free(p) }
            return .string(p.map { String(cString: $0) } ?? "")
        case PLIST_ARRAY:
            var out: [JSON] = []
            for i in 0..<plist_array_get_size(n) {
                guard let item = plist_array_get_item(n, i) else { continue }
                out.append(try convert(item, depth: depth + 1))
            }
            return .array(out)
        case PLIST_DICT:
            var it: plist_dict_iter?
            plist_dict_new_iter(n, &it)
            defer { free(it) }
            var o = JSONObject()
            while true {
                var key: UnsafeMutablePointer<CChar>?
                var val: plist_t?
                plist_dict_next_item(n, it, &key, &val)
                guard let val, let key else { free(key); break }
                let k = String(cString: key)
                free(key)
                o[k] = try convert(val, depth: depth + 1)
            }
            return .object(o)
        case PLIST_DATE:
            var sec: Int32 = 0
            var usec: Int32 = 0
            plist_get_date_val(n, &sec, &usec)
            return .double(Double(sec) + Double(usec) / 1e6)
        case PLIST_DATA:
            var p: UnsafeMutablePointer<CChar>?
            var len: UInt64 = 0
            plist_get_data_val(n, &p, &len)
            defer { free(p) }
            let bytes = p.map { UnsafeRawBufferPointer(start: $0, count: Int(len)) } ?? UnsafeRawBufferPointer(start: nil, count: 0)
            return .string(bytes.map { String($0, radix: 16).count == 1 ? "0" + String($0, radix: 16) : String($0, radix: 16) }.joined())
        case PLIST_UID:
            var v: UInt64 = 0
            plist_get_uid_val(n, &v)
            return .int(Int64(bitPattern: v))
        default:
            return .null
        }
    }
}

#if canImport(Glibc)
import Glibc
#endif
