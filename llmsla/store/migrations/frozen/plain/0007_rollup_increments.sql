-- Faster histogram quantiles (the bucket values no longer parsed on every call) and
-- llmsla_hist_merge (a histogram plus/minus another, with its quantiles in one pass): the
-- histogram functions are re-rendered (CREATE OR REPLACE).
CREATE OR REPLACE FUNCTION llmsla_hist_add(s bigint[], h integer[]) RETURNS bigint[]
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    i integer;
    lo integer;
    hi integer;
BEGIN
    IF h IS NULL OR cardinality(h) = 0 THEN
        RETURN s;
    END IF;
    IF s IS NULL OR cardinality(s) = 0 THEN
        RETURN h::bigint[];
    END IF;
    lo := array_lower(h, 1);
    hi := array_upper(h, 1);
    IF lo < array_lower(s, 1) THEN
        s := array_fill(0::bigint, ARRAY[array_lower(s, 1) - lo], ARRAY[lo]) || s;
    END IF;
    IF hi > array_upper(s, 1) THEN
        s := s || array_fill(0::bigint, ARRAY[hi - array_upper(s, 1)]);
    END IF;
    FOR i IN lo..hi LOOP
        s[i] := s[i] + h[i];
    END LOOP;
    RETURN s;
END $$;

CREATE OR REPLACE FUNCTION llmsla_hist_add(s bigint[], h bigint[]) RETURNS bigint[]
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    i integer;
    lo integer;
    hi integer;
BEGIN
    IF h IS NULL OR cardinality(h) = 0 THEN
        RETURN s;
    END IF;
    IF s IS NULL OR cardinality(s) = 0 THEN
        RETURN h::bigint[];
    END IF;
    lo := array_lower(h, 1);
    hi := array_upper(h, 1);
    IF lo < array_lower(s, 1) THEN
        s := array_fill(0::bigint, ARRAY[array_lower(s, 1) - lo], ARRAY[lo]) || s;
    END IF;
    IF hi > array_upper(s, 1) THEN
        s := s || array_fill(0::bigint, ARRAY[hi - array_upper(s, 1)]);
    END IF;
    FOR i IN lo..hi LOOP
        s[i] := s[i] + h[i];
    END LOOP;
    RETURN s;
END $$;

CREATE OR REPLACE FUNCTION llmsla_hist_value(i integer) RETURNS double precision
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT ('{0.1,0.101,0.10304040404040402,0.10512202836445257,0.10724570570514859,0.1094122856183839,0.11162263482279568,0.11387763754648851,0.116178195880761,0.11852523014097839,0.12091967923473552,0.12336250103745744,0.12585467277558787,0.12839719141751893,0.1309910740724183,0.1336373583971136,0.13633710301119673,0.1390913879205138,0.14190131494921102,0.14476800818050822,0.14769261440637707,0.15067630358630385,0.15372026931532007,0.15682572930148814,0.15999392585303332,0.16322612637531683,0.16652362387784844,0.16988773749154235,0.173319812996422,0.17682122335998604,0.1803933692864504,0.18403767977708574,0.18775561270187532,0.19154865538272128,0.19541832518843277,0.19936617014173444,0.20339376953853716,0.20750273457971968,0.2116947090156736,0.21597136980386902,0.22033442777970474,0.22478562834091087,0.22932675214577775,0.2339596158254904,0.23868607271085382,0.24350801357369936,0.248427367383269,0.2534461020778805,0.2585662253521811,0.2637897854603059,0.2691188720352616,0.27455561692486286,0.28010219504455697,0.28576082524747726,0.2915337712120727,0.29742334234767015,0.3034318947183301,0.3095618319853671,0.31581560636890976,0.32219571962888777,0.32870472406583495,0.3353452235419124,0.34211987452255704,0.3490313871391743,0.35608252627329906,0.36327611266265863,0.37061502402958096,0.3781021962321987,0.38574062443890983,0.3935333643265645,0.4014835333028587,0.4095943117534214,0.4178689443140966,0.42631074116892675,0.4349230793743596,0.44370940421020516,0.4526732305578861,0.46181814430653023,0.4711478037874702,0.480665941237722,0.4903763642930295,0.5002829575110705,0.5103896839254356,0.5207005866309998,0.5312197904013229,0.5419515033387234,0.5529000185576873,0.564069715902287,0.5754650636982929,0.5870906205406825,0.598951037117262,0.6110510580691259,0.623395523888704,0.6359893728561526,0.6488376430148626,0.6619454741868801,0.6753181100290392,0.6889609001306357,0.7028793021534768,0.7170788840151633,0.7315653261164795,0.7463444236137822,0.7614220887372928,0.776804353156228,0.7924973703917072,0.8085074182784083,0.8248409014759519,0.8415043540310214,0.858504441991244,0.8758479660718751,0.8935418643763574,0.9115932151718393,0.9300092397207654,0.9487973051696696,0.9679649274963295,0.9875197745164571,1.0074696689511329,1.0278225915562063,1.0485866843149176,1.0697702536950169,1.0913817739716838,1.1134298906175764,1.1359234237613653,1.1588713717161405,1.182282914579093,1.2061674179039226,1.2305344364474362,1.2553937179918286,1.2807552072441888,1.3066290498147783,1.333025596275683,1.359955406301454,1.3874292528934027,1.415458126689229,1.444053240359718,1.4732260330942577,1.5029881751769698,1.5333515726552922,1.564328372102874,1.5959309654786893,1.6281719950843192,1.6610643586213758,1.694621214351101,1.7288559863581936,1.7637823699209851,1.7994143369900957,1.8357661417777742,1.8728523264601535,1.9106877269947016,1.9492874790552004,1.9886670240866187,2.0288421154823078,2.069828824885991,2.111643548621061,2.154303014249769,2.197824287264915,2.2422247779167312,2.287522248177676,2.3337348188479314,2.3808809768044554,2.428979582396464,2.478049876990332,2.5281114906669044,2.579184450074316,2.631289186439454,2.684446543741261,2.7386777870491645,2.7940046110299552,2.8504491486265198,2.9080339799119037,2.9667821411222453,3.0267171338721885,3.0878629345564756,3.150244003941455,3.2138852969503726,3.278812272646339,3.345050904416972,3.4126276903647894,3.481569663907512,3.551904404592512,3.6236600491297346,3.6968653026475065,3.7715494501757383,3.8477423683611063,3.925474537418906,4.004777053326359,4.085681640262244,4.168220663297845,4.252427141344265,4.338334760361321,4.425977886833267,4.5153915815167665,4.606611613466598,4.699674474344712,4.794617393018343,4.891478350453056,4.990296094906654,5.091110157430019,5.19396086768113,5.298889370058526,5.405937640160718,5.515148501578105,5.6265656430241275,5.740233635812493,5.856197951687493,5.974504981014512,6.0952020513380365,6.218337446314563,6.343960425027988,6.472121241695218,6.602871165769868,6.736262502452087,6.872348613612736,7.011183939140267,7.152824018718856,7.297325514046508,7.444746231501992,7.59514514526971,7.748582420931723,7.905119439536404,8.0648188221533,8.227744454924073,8.393961514619509,8.56353649471283,8.736537231979755,8.913032933635913,9.093094205022496,9.276793077851233,9.46420303901994,9.655399060010245,9.850457626879136,10.049456770856493,10.252476099560662,10.459596828844715,10.67090181528602,10.886475589332202,11.10640438911669,11.330776194957432,11.55968076455253,11.793209668886924,12.031456328864435,12.274516052679878,12.522486073946137,12.775465590591512,13.033555804542855,13.296859962210384,13.565483395790391,13.839533565402316,14.11912010207711,14.404354851614022,14.695351919323393,14.992227715673359,15.29510100285868,15.60409294231037,15.919327143165122,16.240929711713907,16.569029301849543,16.903757166533367,17.24524721030172,17.593636042833065,17.949063033597366,18.311670367609437,18.681603102308614,19.059009225587573,19.44403971499338,19.83684859812456,20.237593014248286,20.64643327716239,21.063532939327285,21.48905885729349,21.92318125845093,22.366073809126707,22.81791368405856,23.278881637271862,23.74916207438847,24.22894312639631,24.71841672490936,25.217778678947933,25.72722875327011,26.246970748285666,26.777212581584365,27.31816637111132,27.870048520022657,28.433079803255435,29.007485455846453,29.593495263035265,30.191343652187495,30.801269786575112,31.423517661051378,32.05833619965848,32.70597935520713,33.366706210867875,34.0407810838147,34.72847363096247,35.43005895684048,36.14581772364535,36.876036263516966,37.62100669308296,38.381027030316964,39.1564013137577,39.947439724136636,40.754458708462636,41.57778110661339,42.41773628048436,43.27466024574667,44.14889580626679,45.040792691241876,45.95070769510534,46.879004820258984,47.82605542268846,48.792238360520535,49.77794014558156,50.78355509801755,51.80948550403809,52.85614177684694,53.923942620823645,55.013315199022095,56.124695304052835,57.25852753241753,58.41526546236536,59.59537183534244,60.79931874110692,62.027587806583824,63.280670388535015,64.55906777012156,65.86329136143715,67.19386290409244,68.55131467993269,69.93618972397172,71.34904204162771,72.79043683034745,74.26095070570798,75.76117193208593,77.29170065798665,78.8531491561278,80.44614206837278,82.07131665561263,83.7293230526957,85.42082452850774,87.14649775130587,88.90703305941305,90.70313473738096,92.53552129773209,94.40492576839335,96.31209598593664,98.25779489474344,100.242800852213,102.26790794013648,104.33392628236145,106.44168236887381,108.5920193864268,110.78579755584954,113.02389447616972,115.30720547568829,117.63664397014662,120.01314182812936,122.43764974384916,124.91113761746224,127.43459494306754,130.00903120454365,132.6354762793829,135.31498085068355,138.04861682746503,140.8374777734744,143.6826793446557,146.5853597354568,149.5466801341529,152.5678251873681,155.65000347398157,158.79444798860746,162.0024166348419,165.27519272847508,168.6140855108685,172.02043067270424,175.49559088831438,179.04095636080555,182.65794537819554,186.3480048807853,190.1126110399931,193.95326984888183,197.87151772461684,201.8689221230939,205.94708216598465,210.10762928044903,214.35222785177115,218.68257588918067,223.1004057051237,227.60748460825747,232.20561561044448,236.89663814802924,241.68242881768634,246.56490212713453,251.54601126101602,256.62774886224867,261.8121478291627,267.10128212874173,272.49726762629206,278.0022629318737,283.61847026383066,289.3481363297667,295.1935532253175,301.15705935108144,307.24104034807294,313.4479300520744,319.7802114672678,326.24041775953583,332.8311332698295,339.55499454800776,346.41469140756345,353.4129680016556,360.55262392088093,367.8365153132219,375.26755602662024,382.8487187746328,390.5830363256355,398.47360271605237,406.52357448809374,414.73617195249966,423.11468047679256,431.6624517995559,440.38290537126403,449.2795297221987,458.35588385800065,467.6155986834148,477.0623784547969,486.70000226196447,496.53232553998384,506.56328161149867,516.7968832602157,527.2372243361797,537.8884813934761,548.754915361021,559.8408732471022,571.1507898783568,582.6891896738791,594.4606884551696,606.4699952926476,618.7219143894688,631.2213470033975,643.9732934075063,656.9828548904862,670.2552357973647,683.7957456114528,697.6098010783508,711.7029283728627,726.0807653096883,740.7490635987728,755.7136911462227,770.9806344017019,786.5560007532513,802.4460209704887,818.657051697165,835.1955779940774,852.0682159333518,869.2817152451365,886.8429620177656,904.7589814524678,923.0369406737295,941.6841515964311,960.7080738509044,980.1163177670842,999.9166474189443,1020.1169837304382,1040.7254076441843,1061.7501633541674,1083.1996616037466,1105.0824830502872,1127.4073816977675,1150.1832883987324,1173.4193144269896,1197.1247551224842,1221.3090936098067,1245.982004591823,1271.1533582199404,1296.8332240425655,1323.0318750333242,1349.7597917006642,1377.0276662804754,1404.8464070134141,1433.2271425086346,1462.1812261956775,1491.7202408662972,1521.8560033080403,1552.600569031435,1583.9662370926758,1615.96555501374,1648.611323801896,1681.9166030706212,1715.8947162639668,1750.559255986471,1785.9240894407428,1822.0033639748995,1858.811512742069,1896.3632604742315,1934.6736293727006,1973.7579451176034,2013.631842998767,2054.3112741704595,2095.812512032488,2138.1521587402153,2181.347151846078,2225.4147710752914,2270.3726452384285,2316.238759283649,2363.0314614913987,2410.7694708144572,2459.4718843662645,2509.1581850605326,2559.8482494051896,2611.562355453779,2664.3211909174915,2718.1458614410767,2773.057899045947,2829.079270743845,2886.232387324528,2944.540112320983,3004.02577115575,3064.713160472027,3126.6265576532805,3189.7907305351646,3254.2309473136525,3319.972986653322,3387.043147999853,3455.46826210086,3525.2757017392614,3596.4933926834888,3669.149824858912,3743.2740637449506,3818.8957620024235,3896.045171335805,3974.7531545951138,4055.0511981222876,4136.97142434698,4220.546604636817,4305.8101724072585,4392.796236496293,4481.539594809349,4572.075748239841,4664.440914870948,4758.672044464301,4854.806833241356,4952.883738963404,5052.941996316199,5155.021632605415,5259.16348376916,5365.40921071399,5473.801315980941,5584.383160748232,5697.198982177488,5812.293911110365,5929.713990122696,6049.506191943356,6171.718438245241,6296.399618815852,6423.599611115161,6553.369300228598,6685.760599223115,6820.82646991449,6958.620944054177,7099.199144944159,7242.617309488484,7388.932810690272,7538.204180603207,7690.491133746705,7845.854590994112,8004.356703943487,8166.060879780729,8331.031806644985,8499.335479506499,8671.039226567233,8846.211736194855,9024.923084400813,9207.244762873555,9393.24970757807,9583.012327933182,9776.608536578295,9974.11577974149,10175.613068221117,10381.18100899326,10590.90183745777,10804.859450335704,11023.139439231372,11245.82912487241,11473.017592041548,11704.795725214106,11941.2562449154,12182.493744812678,12428.60472955637,12679.687653385789,12935.842959514794,13197.173120313071,13463.782678299192,13735.778287961799,14013.268758425673,14296.365096979727,14585.180553484366,14879.830665675969,15180.433305386592,15487.108725697428,15799.979609044853,16119.171116298281,16444.81093682956,16777.029339593788,17115.95922524215,17461.736179287447,17814.498526343752,18174.38738546181,18541.546726582244,18916.123428129362,19298.267335768334,19688.131322349513,20085.871349063644,20491.646527832607,20905.61918496053,21327.954926070845,21758.8227023551,22198.394878160256,22646.847299941266,23104.359366606743,23571.114101285668,24047.29822454396,24533.1022290802,25028.7204559303,25534.35117221172,26050.19665043822,26576.463249436973,27113.361496900336,27661.106173605396,28219.916399334794,28790.015720533476,29371.632199736167,29964.998506801538,30570.352011989446,31187.93488091852,31817.994171442126,32460.781932481357,33116.555304854715,33785.576624144705,34468.113525642584,35164.43905141313,35874.831759522494,36599.57583547243,37338.96120588601,38093.283654489765,38862.844940439056,39647.95291903378,40448.92166487284,41266.07159749653,42099.72960956716,42950.22919763923,43817.910595571324,44703.12091063337,45606.21426236333,46527.55192422925,47467.50246815308,48426.44191195415,49404.7538697714,50402.829705524346,51421.06868947432,52459.878157948544,53519.67367629094,54600.87920510489,55703.92726985448,56829.259133891945,57977.324974980664,59148.584065384304,60343.504955594086,61562.56566176771,62806.25385695492,64075.06706618632,65369.51286550321,66690.10908500833,68037.3840160186,69411.87662240278,70814.13675618872,72244.72537752584,73704.21477909201,75193.18881503327,76712.24313452886,78261.9854200749,79843.03563058146,81456.02624938109,83101.60253724737,84780.42279052506,86493.15860447506,88240.4951419392,90023.1314074329,91841.780526775,93697.17003236638,95590.04215423239,97521.15411694413,99491.27844253894,101501.20325955992,103551.7326183389,105643.68681264877,107777.90270785379,109955.23407568922,112176.55193580415,114442.74490420421,116754.71954873357,119113.40075173829,121519.7320800562,123974.67616248157,126479.21507485495,129034.35073293281,131641.10529319404,134300.5215617434,137013.66341147557,139781.61620766702,142605.4872421653,145486.40617635046,148425.5254930444,151424.02095755032,154483.09208800588,157603.96263523833,160787.88107231382,164036.12109397672,167349.98212617828,170730.789845899,174179.8967114727,177698.68250362366,181288.55487743422,184950.94992546318,188687.3327522402,192499.19806036624,196388.07074845443,200355.50652115044,204403.09251147672,208532.44791574893,212745.2246413196,217043.10796740683,221427.81721927365,225901.10645602667,230464.76517230997,235120.6190141748,239870.53050941063,244716.39981263105,249660.1654654114,254703.80517178334,259849.33658939507,265098.8181366556,270454.349816184,275918.0740548947,281492.1765610542,287178.8871986512,292980.48087943206,298899.27847295586,304937.6477350358,311098.0042549354,317382.8124217018,323794.58641001896,330335.89118597895,337009.3435331704,343817.61309949704,350763.4234651435,357849.553232116,365078.83713579504,372454.16717894236,379978.49378861795,387654.8269964688,395486.2376428621,403475.85860534414,411626.8860519167,419942.5807196321,428426.2692190185,437081.34536485723,445911.2715338443,454919.58004967944,464109.8745961376,473485.8316586858,483051.2019952249,492809.8121365425,502765.5659170787,512922.4460366155,523284.5156535168,533855.9200101534,544640.8880911665,555643.7343152305,566868.8602609929,578320.7564278814,590004.004032485,601923.2768412222,614083.3430400346,626489.0671418534,639145.4119325979,652057.4404564888,665230.3180414683,678669.3143655382,692379.805564842,706367.2763843336,720637.3223718959,735195.6521167826,750048.0895332831,765200.5761905211,780659.1736893196,796430.0660870834,812519.5623716709,828934.09898524,845680.242399083,862764.6917404786,880194.2814726095,897975.9841286216,916116.913100917,934624.325486794,953505.6249915776,972768.3648903974,992420.2510497991,1012469.145010401,1032923.0671318233,1053790.1998011528,1075078.8907062265,1096797.656175039,1118955.1845826155,1141560.339826709,1164622.164873713,1188149.8853762117,1212152.91336361,1236640.8510073193,1261623.4944620125,1287110.8377844775,1313113.0769316384,1339640.613839348,1366704.060583577,1394314.2436256695,1422482.2081433597,1451219.2224492861,1480536.7824987667,1510446.6164886404,1540960.6895490168,1572091.2085298048,1603850.6268839422,1636251.6496492743,1669307.2385310777,1703030.6170872608,1737435.2760183164,1772534.9785641409,1808343.7660098807,1844875.9633030095,1882146.184783878,1920169.3400320373,1958960.6398306643,1998535.6022514855,2038910.058862626,2080100.1610618713,2122122.3865378685,2164993.545861866,2208730.78921261,2253351.613237107,2298873.8680499773,2345315.7643742193,2392695.880826224,2441033.171347965,2490346.9727893383,2540657.0126436683,2591983.4169395,2644346.7182918126,2697767.8641158896,2752268.225007119,2807869.6032900913,2864594.241740396,2922464.8324826253,2981504.5260681324,3041736.940736175,3103186.1718621585,3165876.8015967477,3229833.908699712,3295083.0785724325,3361650.4134930875,3429562.5430586045,3498846.634837566,3569530.405238324,3605586.267917499}'::double precision[])[i + 1] $$;

CREATE OR REPLACE FUNCTION llmsla_hist_quantile(h bigint[], q double precision) RETURNS double precision
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SET search_path FROM CURRENT AS $$
DECLARE
    n bigint := 0;
    c bigint := 0;
    k double precision;
    i integer;
BEGIN
    IF h IS NULL OR q IS NULL OR cardinality(h) = 0 THEN
        RETURN NULL;
    END IF;
    IF q < 0 OR q > 1 THEN
        RAISE EXCEPTION 'llmsla_hist_quantile: q must be in [0, 1], got %', q;
    END IF;
    IF array_lower(h, 1) < 0 OR array_upper(h, 1) > 871 THEN
        RAISE EXCEPTION 'llmsla_hist_quantile: buckets %..% outside the layout 0..871', array_lower(h, 1), array_upper(h, 1);
    END IF;
    FOR i IN array_lower(h, 1)..array_upper(h, 1) LOOP
        n := n + h[i];
    END LOOP;
    IF n = 0 THEN
        RETURN NULL;
    END IF;
    k := greatest(1, ceil(q * n));
    FOR i IN array_lower(h, 1)..array_upper(h, 1) LOOP
        c := c + h[i];
        IF c >= k THEN
            RETURN llmsla_hist_value(i);
        END IF;
    END LOOP;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION llmsla_hist_merge(a bigint[], plus bigint[], minus bigint[],
    OUT h bigint[], OUT p50 double precision, OUT p95 double precision, OUT p99 double precision)
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SET search_path FROM CURRENT AS $$
DECLARE
    lo integer;
    hi integer;
    i integer;
    n bigint := 0;
    c bigint := 0;
    k50 double precision;
    k95 double precision;
    k99 double precision;
BEGIN
    h := llmsla_hist_add(a, plus);
    IF h IS NULL OR cardinality(h) = 0 THEN
        h := NULL;
        RETURN;
    END IF;
    lo := array_lower(h, 1);
    hi := array_upper(h, 1);
    IF minus IS NOT NULL AND cardinality(minus) > 0 THEN
        FOR i IN greatest(lo, array_lower(minus, 1))..least(hi, array_upper(minus, 1)) LOOP
            h[i] := greatest(h[i] - minus[i], 0);
        END LOOP;
        WHILE lo <= hi AND h[lo] = 0 LOOP
            lo := lo + 1;
        END LOOP;
        WHILE hi >= lo AND h[hi] = 0 LOOP
            hi := hi - 1;
        END LOOP;
        IF lo > hi THEN
            h := NULL;
            RETURN;
        END IF;
        IF lo > array_lower(h, 1) OR hi < array_upper(h, 1) THEN
            h := ('[' || lo || ':' || hi || ']=' || h[lo:hi]::text)::bigint[];
        END IF;
    END IF;
    FOR i IN lo..hi LOOP
        n := n + h[i];
    END LOOP;
    k50 := greatest(1, ceil(0.5::double precision * n));
    k95 := greatest(1, ceil(0.95::double precision * n));
    k99 := greatest(1, ceil(0.99::double precision * n));
    FOR i IN lo..hi LOOP
        c := c + h[i];
        IF p50 IS NULL AND c >= k50 THEN
            p50 := llmsla_hist_value(i);
        END IF;
        IF p95 IS NULL AND c >= k95 THEN
            p95 := llmsla_hist_value(i);
        END IF;
        IF c >= k99 THEN
            p99 := llmsla_hist_value(i);
            EXIT;
        END IF;
    END LOOP;
END $$;

CREATE OR REPLACE FUNCTION llmsla_hist_final_p50(s bigint[]) RETURNS double precision
LANGUAGE sql IMMUTABLE PARALLEL SAFE SET search_path FROM CURRENT AS $$ SELECT llmsla_hist_quantile(s, 0.5) $$;

CREATE OR REPLACE FUNCTION llmsla_hist_final_p95(s bigint[]) RETURNS double precision
LANGUAGE sql IMMUTABLE PARALLEL SAFE SET search_path FROM CURRENT AS $$ SELECT llmsla_hist_quantile(s, 0.95) $$;

CREATE OR REPLACE FUNCTION llmsla_hist_final_p99(s bigint[]) RETURNS double precision
LANGUAGE sql IMMUTABLE PARALLEL SAFE SET search_path FROM CURRENT AS $$ SELECT llmsla_hist_quantile(s, 0.99) $$;

CREATE OR REPLACE AGGREGATE llmsla_hist_sum(integer[]) (SFUNC = llmsla_hist_add, STYPE = bigint[], COMBINEFUNC = llmsla_hist_add, PARALLEL = SAFE);

CREATE OR REPLACE AGGREGATE llmsla_hist_p50(integer[]) (SFUNC = llmsla_hist_add, STYPE = bigint[], COMBINEFUNC = llmsla_hist_add, PARALLEL = SAFE, FINALFUNC = llmsla_hist_final_p50);

CREATE OR REPLACE AGGREGATE llmsla_hist_p95(integer[]) (SFUNC = llmsla_hist_add, STYPE = bigint[], COMBINEFUNC = llmsla_hist_add, PARALLEL = SAFE, FINALFUNC = llmsla_hist_final_p95);

CREATE OR REPLACE AGGREGATE llmsla_hist_p99(integer[]) (SFUNC = llmsla_hist_add, STYPE = bigint[], COMBINEFUNC = llmsla_hist_add, PARALLEL = SAFE, FINALFUNC = llmsla_hist_final_p99);

CREATE OR REPLACE AGGREGATE llmsla_hist_sum(bigint[]) (SFUNC = llmsla_hist_add, STYPE = bigint[], COMBINEFUNC = llmsla_hist_add, PARALLEL = SAFE);

CREATE OR REPLACE AGGREGATE llmsla_hist_p50(bigint[]) (SFUNC = llmsla_hist_add, STYPE = bigint[], COMBINEFUNC = llmsla_hist_add, PARALLEL = SAFE, FINALFUNC = llmsla_hist_final_p50);

CREATE OR REPLACE AGGREGATE llmsla_hist_p95(bigint[]) (SFUNC = llmsla_hist_add, STYPE = bigint[], COMBINEFUNC = llmsla_hist_add, PARALLEL = SAFE, FINALFUNC = llmsla_hist_final_p95);

CREATE OR REPLACE AGGREGATE llmsla_hist_p99(bigint[]) (SFUNC = llmsla_hist_add, STYPE = bigint[], COMBINEFUNC = llmsla_hist_add, PARALLEL = SAFE, FINALFUNC = llmsla_hist_final_p99);

-- Plain PostgreSQL: the request roll-up triggers add new windows to their 1 m / 1 h groups and
-- take a replayed window's old values back, instead of re-aggregating every touched group from
-- its rows on each write (llmsla.store.rollups.rollup_increments_ddl).
ALTER TABLE request_windows_1m SET (toast_tuple_target = 8160);

ALTER TABLE request_windows_1h SET (toast_tuple_target = 8160);

CREATE OR REPLACE FUNCTION llmsla_request_rollups_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(296026384);
    INSERT INTO request_windows_1m AS t (bucket, model, pool, replica, arm, windows, requests, ok, errors, timeouts, cancelled, rejected, prompt_tokens, output_tokens, ttft_within_slo, e2e_within_slo, ttft_count, ttft_sum_ms, e2e_sum_ms, itl_n, itl_sum_ms, itl_sumsq_ms2, ttft_p99_ms_max, e2e_p99_ms_max, queue_p99_ms_max, ttft_slo_ms, e2e_slo_ms, ttft_hist, e2e_hist)
    SELECT date_bin(INTERVAL '1 minute', bucket, TIMESTAMPTZ '2000-01-01 00:00:00+00'), model, pool, replica, arm, count(*) AS windows, sum(requests) AS requests, sum(ok) AS ok, sum(errors) AS errors, sum(timeouts) AS timeouts, sum(cancelled) AS cancelled, sum(rejected) AS rejected, sum(prompt_tokens) AS prompt_tokens, sum(output_tokens) AS output_tokens, sum(ttft_within_slo) AS ttft_within_slo, sum(e2e_within_slo) AS e2e_within_slo, sum(ttft_count) AS ttft_count, sum(ttft_sum_ms) AS ttft_sum_ms, sum(e2e_sum_ms) AS e2e_sum_ms, sum(itl_n) AS itl_n, sum(itl_sum_ms) AS itl_sum_ms, sum(itl_sumsq_ms2) AS itl_sumsq_ms2, max(ttft_p99_ms) AS ttft_p99_ms_max, max(e2e_p99_ms) AS e2e_p99_ms_max, max(queue_p99_ms) AS queue_p99_ms_max, max(ttft_slo_ms) AS ttft_slo_ms, max(e2e_slo_ms) AS e2e_slo_ms, llmsla_hist_sum(ttft_hist) AS ttft_hist, llmsla_hist_sum(e2e_hist) AS e2e_hist
    FROM llmsla_new_rows GROUP BY 1, model, pool, replica, arm
    ON CONFLICT (bucket, model, pool, replica, arm) DO UPDATE SET windows = t.windows + EXCLUDED.windows, requests = COALESCE(t.requests + EXCLUDED.requests, t.requests, EXCLUDED.requests), ok = COALESCE(t.ok + EXCLUDED.ok, t.ok, EXCLUDED.ok), errors = COALESCE(t.errors + EXCLUDED.errors, t.errors, EXCLUDED.errors), timeouts = COALESCE(t.timeouts + EXCLUDED.timeouts, t.timeouts, EXCLUDED.timeouts), cancelled = COALESCE(t.cancelled + EXCLUDED.cancelled, t.cancelled, EXCLUDED.cancelled), rejected = COALESCE(t.rejected + EXCLUDED.rejected, t.rejected, EXCLUDED.rejected), prompt_tokens = COALESCE(t.prompt_tokens + EXCLUDED.prompt_tokens, t.prompt_tokens, EXCLUDED.prompt_tokens), output_tokens = COALESCE(t.output_tokens + EXCLUDED.output_tokens, t.output_tokens, EXCLUDED.output_tokens), ttft_within_slo = COALESCE(t.ttft_within_slo + EXCLUDED.ttft_within_slo, t.ttft_within_slo, EXCLUDED.ttft_within_slo), e2e_within_slo = COALESCE(t.e2e_within_slo + EXCLUDED.e2e_within_slo, t.e2e_within_slo, EXCLUDED.e2e_within_slo), ttft_count = COALESCE(t.ttft_count + EXCLUDED.ttft_count, t.ttft_count, EXCLUDED.ttft_count), ttft_sum_ms = COALESCE(t.ttft_sum_ms + EXCLUDED.ttft_sum_ms, t.ttft_sum_ms, EXCLUDED.ttft_sum_ms), e2e_sum_ms = COALESCE(t.e2e_sum_ms + EXCLUDED.e2e_sum_ms, t.e2e_sum_ms, EXCLUDED.e2e_sum_ms), itl_n = COALESCE(t.itl_n + EXCLUDED.itl_n, t.itl_n, EXCLUDED.itl_n), itl_sum_ms = COALESCE(t.itl_sum_ms + EXCLUDED.itl_sum_ms, t.itl_sum_ms, EXCLUDED.itl_sum_ms), itl_sumsq_ms2 = COALESCE(t.itl_sumsq_ms2 + EXCLUDED.itl_sumsq_ms2, t.itl_sumsq_ms2, EXCLUDED.itl_sumsq_ms2), ttft_p99_ms_max = GREATEST(t.ttft_p99_ms_max, EXCLUDED.ttft_p99_ms_max), e2e_p99_ms_max = GREATEST(t.e2e_p99_ms_max, EXCLUDED.e2e_p99_ms_max), queue_p99_ms_max = GREATEST(t.queue_p99_ms_max, EXCLUDED.queue_p99_ms_max), ttft_slo_ms = GREATEST(t.ttft_slo_ms, EXCLUDED.ttft_slo_ms), e2e_slo_ms = GREATEST(t.e2e_slo_ms, EXCLUDED.e2e_slo_ms), (ttft_hist, ttft_p50_ms, ttft_p95_ms, ttft_p99_ms) = (SELECT m.h, m.p50, m.p95, m.p99 FROM llmsla_hist_merge(t.ttft_hist, EXCLUDED.ttft_hist, NULL) m), (e2e_hist, e2e_p50_ms, e2e_p95_ms, e2e_p99_ms) = (SELECT m.h, m.p50, m.p95, m.p99 FROM llmsla_hist_merge(t.e2e_hist, EXCLUDED.e2e_hist, NULL) m);
    UPDATE request_windows_1m t SET (ttft_hist, ttft_p50_ms, ttft_p95_ms, ttft_p99_ms) = (SELECT m.h, m.p50, m.p95, m.p99 FROM llmsla_hist_merge(t.ttft_hist, NULL, NULL) m), (e2e_hist, e2e_p50_ms, e2e_p95_ms, e2e_p99_ms) = (SELECT m.h, m.p50, m.p95, m.p99 FROM llmsla_hist_merge(t.e2e_hist, NULL, NULL) m)
    WHERE ((ttft_p50_ms IS NULL AND ttft_hist IS NOT NULL) OR (e2e_p50_ms IS NULL AND e2e_hist IS NOT NULL)) AND (bucket, model, pool, replica, arm) IN (SELECT date_bin(INTERVAL '1 minute', bucket, TIMESTAMPTZ '2000-01-01 00:00:00+00'), model, pool, replica, arm FROM llmsla_new_rows);
    INSERT INTO request_windows_1h AS t (bucket, model, pool, replica, arm, windows, requests, ok, errors, timeouts, cancelled, rejected, prompt_tokens, output_tokens, ttft_within_slo, e2e_within_slo, ttft_count, ttft_sum_ms, e2e_sum_ms, itl_n, itl_sum_ms, itl_sumsq_ms2, ttft_p99_ms_max, e2e_p99_ms_max, queue_p99_ms_max, ttft_slo_ms, e2e_slo_ms, ttft_hist, e2e_hist)
    SELECT date_bin(INTERVAL '1 hour', bucket, TIMESTAMPTZ '2000-01-01 00:00:00+00'), model, pool, replica, arm, count(*) AS windows, sum(requests) AS requests, sum(ok) AS ok, sum(errors) AS errors, sum(timeouts) AS timeouts, sum(cancelled) AS cancelled, sum(rejected) AS rejected, sum(prompt_tokens) AS prompt_tokens, sum(output_tokens) AS output_tokens, sum(ttft_within_slo) AS ttft_within_slo, sum(e2e_within_slo) AS e2e_within_slo, sum(ttft_count) AS ttft_count, sum(ttft_sum_ms) AS ttft_sum_ms, sum(e2e_sum_ms) AS e2e_sum_ms, sum(itl_n) AS itl_n, sum(itl_sum_ms) AS itl_sum_ms, sum(itl_sumsq_ms2) AS itl_sumsq_ms2, max(ttft_p99_ms) AS ttft_p99_ms_max, max(e2e_p99_ms) AS e2e_p99_ms_max, max(queue_p99_ms) AS queue_p99_ms_max, max(ttft_slo_ms) AS ttft_slo_ms, max(e2e_slo_ms) AS e2e_slo_ms, llmsla_hist_sum(ttft_hist) AS ttft_hist, llmsla_hist_sum(e2e_hist) AS e2e_hist
    FROM llmsla_new_rows GROUP BY 1, model, pool, replica, arm
    ON CONFLICT (bucket, model, pool, replica, arm) DO UPDATE SET windows = t.windows + EXCLUDED.windows, requests = COALESCE(t.requests + EXCLUDED.requests, t.requests, EXCLUDED.requests), ok = COALESCE(t.ok + EXCLUDED.ok, t.ok, EXCLUDED.ok), errors = COALESCE(t.errors + EXCLUDED.errors, t.errors, EXCLUDED.errors), timeouts = COALESCE(t.timeouts + EXCLUDED.timeouts, t.timeouts, EXCLUDED.timeouts), cancelled = COALESCE(t.cancelled + EXCLUDED.cancelled, t.cancelled, EXCLUDED.cancelled), rejected = COALESCE(t.rejected + EXCLUDED.rejected, t.rejected, EXCLUDED.rejected), prompt_tokens = COALESCE(t.prompt_tokens + EXCLUDED.prompt_tokens, t.prompt_tokens, EXCLUDED.prompt_tokens), output_tokens = COALESCE(t.output_tokens + EXCLUDED.output_tokens, t.output_tokens, EXCLUDED.output_tokens), ttft_within_slo = COALESCE(t.ttft_within_slo + EXCLUDED.ttft_within_slo, t.ttft_within_slo, EXCLUDED.ttft_within_slo), e2e_within_slo = COALESCE(t.e2e_within_slo + EXCLUDED.e2e_within_slo, t.e2e_within_slo, EXCLUDED.e2e_within_slo), ttft_count = COALESCE(t.ttft_count + EXCLUDED.ttft_count, t.ttft_count, EXCLUDED.ttft_count), ttft_sum_ms = COALESCE(t.ttft_sum_ms + EXCLUDED.ttft_sum_ms, t.ttft_sum_ms, EXCLUDED.ttft_sum_ms), e2e_sum_ms = COALESCE(t.e2e_sum_ms + EXCLUDED.e2e_sum_ms, t.e2e_sum_ms, EXCLUDED.e2e_sum_ms), itl_n = COALESCE(t.itl_n + EXCLUDED.itl_n, t.itl_n, EXCLUDED.itl_n), itl_sum_ms = COALESCE(t.itl_sum_ms + EXCLUDED.itl_sum_ms, t.itl_sum_ms, EXCLUDED.itl_sum_ms), itl_sumsq_ms2 = COALESCE(t.itl_sumsq_ms2 + EXCLUDED.itl_sumsq_ms2, t.itl_sumsq_ms2, EXCLUDED.itl_sumsq_ms2), ttft_p99_ms_max = GREATEST(t.ttft_p99_ms_max, EXCLUDED.ttft_p99_ms_max), e2e_p99_ms_max = GREATEST(t.e2e_p99_ms_max, EXCLUDED.e2e_p99_ms_max), queue_p99_ms_max = GREATEST(t.queue_p99_ms_max, EXCLUDED.queue_p99_ms_max), ttft_slo_ms = GREATEST(t.ttft_slo_ms, EXCLUDED.ttft_slo_ms), e2e_slo_ms = GREATEST(t.e2e_slo_ms, EXCLUDED.e2e_slo_ms), (ttft_hist, ttft_p50_ms, ttft_p95_ms, ttft_p99_ms) = (SELECT m.h, m.p50, m.p95, m.p99 FROM llmsla_hist_merge(t.ttft_hist, EXCLUDED.ttft_hist, NULL) m), (e2e_hist, e2e_p50_ms, e2e_p95_ms, e2e_p99_ms) = (SELECT m.h, m.p50, m.p95, m.p99 FROM llmsla_hist_merge(t.e2e_hist, EXCLUDED.e2e_hist, NULL) m);
    UPDATE request_windows_1h t SET (ttft_hist, ttft_p50_ms, ttft_p95_ms, ttft_p99_ms) = (SELECT m.h, m.p50, m.p95, m.p99 FROM llmsla_hist_merge(t.ttft_hist, NULL, NULL) m), (e2e_hist, e2e_p50_ms, e2e_p95_ms, e2e_p99_ms) = (SELECT m.h, m.p50, m.p95, m.p99 FROM llmsla_hist_merge(t.e2e_hist, NULL, NULL) m)
    WHERE ((ttft_p50_ms IS NULL AND ttft_hist IS NOT NULL) OR (e2e_p50_ms IS NULL AND e2e_hist IS NOT NULL)) AND (bucket, model, pool, replica, arm) IN (SELECT date_bin(INTERVAL '1 hour', bucket, TIMESTAMPTZ '2000-01-01 00:00:00+00'), model, pool, replica, arm FROM llmsla_new_rows);
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION llmsla_request_rollups_update() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(296026384);
    WITH d AS (SELECT b, model, pool, replica, arm, sum(sign * requests) AS requests, sum(sign * ok) AS ok, sum(sign * errors) AS errors, sum(sign * timeouts) AS timeouts, sum(sign * cancelled) AS cancelled, sum(sign * rejected) AS rejected, sum(sign * prompt_tokens) AS prompt_tokens, sum(sign * output_tokens) AS output_tokens, sum(sign * ttft_within_slo) AS ttft_within_slo, sum(sign * e2e_within_slo) AS e2e_within_slo, sum(sign * ttft_count) AS ttft_count, sum(sign * ttft_sum_ms) AS ttft_sum_ms, sum(sign * e2e_sum_ms) AS e2e_sum_ms, sum(sign * itl_n) AS itl_n, sum(sign * itl_sum_ms) AS itl_sum_ms, sum(sign * itl_sumsq_ms2) AS itl_sumsq_ms2, llmsla_hist_sum(ttft_hist) FILTER (WHERE sign > 0) AS ttft_hist_plus, llmsla_hist_sum(e2e_hist) FILTER (WHERE sign > 0) AS e2e_hist_plus, llmsla_hist_sum(ttft_hist) FILTER (WHERE sign < 0) AS ttft_hist_minus, llmsla_hist_sum(e2e_hist) FILTER (WHERE sign < 0) AS e2e_hist_minus
               FROM (SELECT 1 AS sign, date_bin(INTERVAL '1 minute', bucket, TIMESTAMPTZ '2000-01-01 00:00:00+00') AS b, model, pool, replica, arm, requests, ok, errors, timeouts, cancelled, rejected, prompt_tokens, output_tokens, ttft_within_slo, e2e_within_slo, ttft_count, ttft_sum_ms, e2e_sum_ms, itl_n, itl_sum_ms, itl_sumsq_ms2, ttft_p99_ms, e2e_p99_ms, queue_p99_ms, ttft_slo_ms, e2e_slo_ms, ttft_hist, e2e_hist FROM llmsla_new_rows
                     UNION ALL SELECT -1 AS sign, date_bin(INTERVAL '1 minute', bucket, TIMESTAMPTZ '2000-01-01 00:00:00+00') AS b, model, pool, replica, arm, requests, ok, errors, timeouts, cancelled, rejected, prompt_tokens, output_tokens, ttft_within_slo, e2e_within_slo, ttft_count, ttft_sum_ms, e2e_sum_ms, itl_n, itl_sum_ms, itl_sumsq_ms2, ttft_p99_ms, e2e_p99_ms, queue_p99_ms, ttft_slo_ms, e2e_slo_ms, ttft_hist, e2e_hist FROM llmsla_old_rows) r
               GROUP BY b, model, pool, replica, arm),
    x AS (SELECT g.b, g.model, g.pool, g.replica, g.arm, max(s.ttft_p99_ms) AS ttft_p99_ms_max, max(s.e2e_p99_ms) AS e2e_p99_ms_max, max(s.queue_p99_ms) AS queue_p99_ms_max, max(s.ttft_slo_ms) AS ttft_slo_ms, max(s.e2e_slo_ms) AS e2e_slo_ms
          FROM request_windows s JOIN d g ON g.b = date_bin(INTERVAL '1 minute', s.bucket, TIMESTAMPTZ '2000-01-01 00:00:00+00') AND s.model = g.model AND s.pool = g.pool AND s.replica = g.replica AND s.arm = g.arm
          WHERE s.bucket >= (SELECT min(b) FROM d) AND s.bucket < (SELECT max(b) FROM d) + INTERVAL '1 minute'
          GROUP BY g.b, g.model, g.pool, g.replica, g.arm)
    UPDATE request_windows_1m t SET requests = COALESCE(t.requests + d.requests, t.requests, d.requests), ok = COALESCE(t.ok + d.ok, t.ok, d.ok), errors = COALESCE(t.errors + d.errors, t.errors, d.errors), timeouts = COALESCE(t.timeouts + d.timeouts, t.timeouts, d.timeouts), cancelled = COALESCE(t.cancelled + d.cancelled, t.cancelled, d.cancelled), rejected = COALESCE(t.rejected + d.rejected, t.rejected, d.rejected), prompt_tokens = COALESCE(t.prompt_tokens + d.prompt_tokens, t.prompt_tokens, d.prompt_tokens), output_tokens = COALESCE(t.output_tokens + d.output_tokens, t.output_tokens, d.output_tokens), ttft_within_slo = COALESCE(t.ttft_within_slo + d.ttft_within_slo, t.ttft_within_slo, d.ttft_within_slo), e2e_within_slo = COALESCE(t.e2e_within_slo + d.e2e_within_slo, t.e2e_within_slo, d.e2e_within_slo), ttft_count = COALESCE(t.ttft_count + d.ttft_count, t.ttft_count, d.ttft_count), ttft_sum_ms = COALESCE(t.ttft_sum_ms + d.ttft_sum_ms, t.ttft_sum_ms, d.ttft_sum_ms), e2e_sum_ms = COALESCE(t.e2e_sum_ms + d.e2e_sum_ms, t.e2e_sum_ms, d.e2e_sum_ms), itl_n = COALESCE(t.itl_n + d.itl_n, t.itl_n, d.itl_n), itl_sum_ms = COALESCE(t.itl_sum_ms + d.itl_sum_ms, t.itl_sum_ms, d.itl_sum_ms), itl_sumsq_ms2 = COALESCE(t.itl_sumsq_ms2 + d.itl_sumsq_ms2, t.itl_sumsq_ms2, d.itl_sumsq_ms2), ttft_p99_ms_max = x.ttft_p99_ms_max, e2e_p99_ms_max = x.e2e_p99_ms_max, queue_p99_ms_max = x.queue_p99_ms_max, ttft_slo_ms = x.ttft_slo_ms, e2e_slo_ms = x.e2e_slo_ms, (ttft_hist, ttft_p50_ms, ttft_p95_ms, ttft_p99_ms) = (SELECT m.h, m.p50, m.p95, m.p99 FROM llmsla_hist_merge(t.ttft_hist, d.ttft_hist_plus, d.ttft_hist_minus) m), (e2e_hist, e2e_p50_ms, e2e_p95_ms, e2e_p99_ms) = (SELECT m.h, m.p50, m.p95, m.p99 FROM llmsla_hist_merge(t.e2e_hist, d.e2e_hist_plus, d.e2e_hist_minus) m)
    FROM d JOIN x USING (b, model, pool, replica, arm)
    WHERE t.bucket = d.b AND t.model = d.model AND t.pool = d.pool AND t.replica = d.replica AND t.arm = d.arm;
    WITH d AS (SELECT b, model, pool, replica, arm, sum(sign * requests) AS requests, sum(sign * ok) AS ok, sum(sign * errors) AS errors, sum(sign * timeouts) AS timeouts, sum(sign * cancelled) AS cancelled, sum(sign * rejected) AS rejected, sum(sign * prompt_tokens) AS prompt_tokens, sum(sign * output_tokens) AS output_tokens, sum(sign * ttft_within_slo) AS ttft_within_slo, sum(sign * e2e_within_slo) AS e2e_within_slo, sum(sign * ttft_count) AS ttft_count, sum(sign * ttft_sum_ms) AS ttft_sum_ms, sum(sign * e2e_sum_ms) AS e2e_sum_ms, sum(sign * itl_n) AS itl_n, sum(sign * itl_sum_ms) AS itl_sum_ms, sum(sign * itl_sumsq_ms2) AS itl_sumsq_ms2, llmsla_hist_sum(ttft_hist) FILTER (WHERE sign > 0) AS ttft_hist_plus, llmsla_hist_sum(e2e_hist) FILTER (WHERE sign > 0) AS e2e_hist_plus, llmsla_hist_sum(ttft_hist) FILTER (WHERE sign < 0) AS ttft_hist_minus, llmsla_hist_sum(e2e_hist) FILTER (WHERE sign < 0) AS e2e_hist_minus
               FROM (SELECT 1 AS sign, date_bin(INTERVAL '1 hour', bucket, TIMESTAMPTZ '2000-01-01 00:00:00+00') AS b, model, pool, replica, arm, requests, ok, errors, timeouts, cancelled, rejected, prompt_tokens, output_tokens, ttft_within_slo, e2e_within_slo, ttft_count, ttft_sum_ms, e2e_sum_ms, itl_n, itl_sum_ms, itl_sumsq_ms2, ttft_p99_ms, e2e_p99_ms, queue_p99_ms, ttft_slo_ms, e2e_slo_ms, ttft_hist, e2e_hist FROM llmsla_new_rows
                     UNION ALL SELECT -1 AS sign, date_bin(INTERVAL '1 hour', bucket, TIMESTAMPTZ '2000-01-01 00:00:00+00') AS b, model, pool, replica, arm, requests, ok, errors, timeouts, cancelled, rejected, prompt_tokens, output_tokens, ttft_within_slo, e2e_within_slo, ttft_count, ttft_sum_ms, e2e_sum_ms, itl_n, itl_sum_ms, itl_sumsq_ms2, ttft_p99_ms, e2e_p99_ms, queue_p99_ms, ttft_slo_ms, e2e_slo_ms, ttft_hist, e2e_hist FROM llmsla_old_rows) r
               GROUP BY b, model, pool, replica, arm),
    x AS (SELECT g.b, g.model, g.pool, g.replica, g.arm, max(s.ttft_p99_ms_max) AS ttft_p99_ms_max, max(s.e2e_p99_ms_max) AS e2e_p99_ms_max, max(s.queue_p99_ms_max) AS queue_p99_ms_max, max(s.ttft_slo_ms) AS ttft_slo_ms, max(s.e2e_slo_ms) AS e2e_slo_ms
          FROM request_windows_1m s JOIN d g ON g.b = date_bin(INTERVAL '1 hour', s.bucket, TIMESTAMPTZ '2000-01-01 00:00:00+00') AND s.model = g.model AND s.pool = g.pool AND s.replica = g.replica AND s.arm = g.arm
          WHERE s.bucket >= (SELECT min(b) FROM d) AND s.bucket < (SELECT max(b) FROM d) + INTERVAL '1 hour'
          GROUP BY g.b, g.model, g.pool, g.replica, g.arm)
    UPDATE request_windows_1h t SET requests = COALESCE(t.requests + d.requests, t.requests, d.requests), ok = COALESCE(t.ok + d.ok, t.ok, d.ok), errors = COALESCE(t.errors + d.errors, t.errors, d.errors), timeouts = COALESCE(t.timeouts + d.timeouts, t.timeouts, d.timeouts), cancelled = COALESCE(t.cancelled + d.cancelled, t.cancelled, d.cancelled), rejected = COALESCE(t.rejected + d.rejected, t.rejected, d.rejected), prompt_tokens = COALESCE(t.prompt_tokens + d.prompt_tokens, t.prompt_tokens, d.prompt_tokens), output_tokens = COALESCE(t.output_tokens + d.output_tokens, t.output_tokens, d.output_tokens), ttft_within_slo = COALESCE(t.ttft_within_slo + d.ttft_within_slo, t.ttft_within_slo, d.ttft_within_slo), e2e_within_slo = COALESCE(t.e2e_within_slo + d.e2e_within_slo, t.e2e_within_slo, d.e2e_within_slo), ttft_count = COALESCE(t.ttft_count + d.ttft_count, t.ttft_count, d.ttft_count), ttft_sum_ms = COALESCE(t.ttft_sum_ms + d.ttft_sum_ms, t.ttft_sum_ms, d.ttft_sum_ms), e2e_sum_ms = COALESCE(t.e2e_sum_ms + d.e2e_sum_ms, t.e2e_sum_ms, d.e2e_sum_ms), itl_n = COALESCE(t.itl_n + d.itl_n, t.itl_n, d.itl_n), itl_sum_ms = COALESCE(t.itl_sum_ms + d.itl_sum_ms, t.itl_sum_ms, d.itl_sum_ms), itl_sumsq_ms2 = COALESCE(t.itl_sumsq_ms2 + d.itl_sumsq_ms2, t.itl_sumsq_ms2, d.itl_sumsq_ms2), ttft_p99_ms_max = x.ttft_p99_ms_max, e2e_p99_ms_max = x.e2e_p99_ms_max, queue_p99_ms_max = x.queue_p99_ms_max, ttft_slo_ms = x.ttft_slo_ms, e2e_slo_ms = x.e2e_slo_ms, (ttft_hist, ttft_p50_ms, ttft_p95_ms, ttft_p99_ms) = (SELECT m.h, m.p50, m.p95, m.p99 FROM llmsla_hist_merge(t.ttft_hist, d.ttft_hist_plus, d.ttft_hist_minus) m), (e2e_hist, e2e_p50_ms, e2e_p95_ms, e2e_p99_ms) = (SELECT m.h, m.p50, m.p95, m.p99 FROM llmsla_hist_merge(t.e2e_hist, d.e2e_hist_plus, d.e2e_hist_minus) m)
    FROM d JOIN x USING (b, model, pool, replica, arm)
    WHERE t.bucket = d.b AND t.model = d.model AND t.pool = d.pool AND t.replica = d.replica AND t.arm = d.arm;
    RETURN NULL;
END $$;

DROP TRIGGER IF EXISTS request_windows_rollup_insert ON request_windows;

DROP TRIGGER IF EXISTS request_windows_rollup_update ON request_windows;

CREATE TRIGGER request_windows_rollup_insert AFTER INSERT ON request_windows
REFERENCING NEW TABLE AS llmsla_new_rows FOR EACH STATEMENT EXECUTE FUNCTION llmsla_request_rollups_insert();

CREATE TRIGGER request_windows_rollup_update AFTER UPDATE ON request_windows
REFERENCING OLD TABLE AS llmsla_old_rows NEW TABLE AS llmsla_new_rows FOR EACH STATEMENT EXECUTE FUNCTION llmsla_request_rollups_update();

DROP FUNCTION IF EXISTS llmsla_request_rollups();
