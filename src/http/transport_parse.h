// The transport's HTTP/1.1 request parsing, shared by its connections
// (transport.cpp) and parse_request (the fuzz target's entry): Beast's
// parser configured from TransportOptions, the head and Content-Type checks
// Beast leaves to the application, and the ParseError each failure answers
// with (status, code, message; transport.h). Private to src/http.
#pragma once

#include <boost/beast/core/error.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>

#include <optional>
#include <string>
#include <string_view>

#include "http/transport.h"

namespace spw::http::wire {

using Parser = boost::beast::http::request_parser<boost::beast::http::string_body>;

bool iequals(std::string_view a, std::string_view b);  // ASCII case-insensitive
ParseError parse_error(int status, std::string code, std::string message);
// The answer to a parser error; `unparsed`: the bytes the parser refused,
// from where it stopped (to tell a malformed line from a version not served).
ParseError from_beast(const boost::beast::error_code& ec, const TransportOptions& o, std::string_view unparsed = {});
// The header and body limits of `o`, eager body parsing.
void configure(Parser& p, const TransportOptions& o);
// Head checks that Beast's parser leaves to the application.
std::optional<ParseError> check_head(const Parser::value_type& msg);
// A body's Content-Type must say JSON (or be absent): 415 otherwise.
std::optional<ParseError> check_content_type(const Request& r);
Request request_from(Parser::value_type&& msg, std::string peer);

}  // namespace spw::http::wire
